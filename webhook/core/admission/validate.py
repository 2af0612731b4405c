"""Validation commits to a mutation's plan: the final pod (after every mutating webhook) must carry the
sealed allocation with its limits and node requirement intact, and still fit its namespace's quotas."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.domain.decision import Decision, allowed, denied, refused, warning
from webhook.core.domain.model import Allocation, Snapshot
from webhook.core.domain.request import PodRequest
from webhook.core.podspec.coerce import is_mapping
from webhook.core.podspec.limits import limit_env
from webhook.core.podspec.podshape import read_pod
from webhook.core.podspec.record import ANNOTATION, RecordKey, Sealed
from webhook.core.podspec.view import view_for
from webhook.core.policy.model import Policy

from . import trust
from .envfrom import missing_pins
from .neutralise import missing_sidecar_void
from .no_gpu_reach import after_screen
from .quota import check_quota
from .scope import DEFAULT_SCHEDULERS
from .screen import backend_of, screen


def validate(pod: Mapping[str, Any], snapshot: Snapshot, policy: Policy, *, namespace: str | None = None,
             record_key: RecordKey = b"") -> Decision:
    """Commit: the final pod must carry the allocation its mutation recorded and sealed, with limits and
    node requirement intact, and still fit its namespace's quotas (counting reservations). Never returns
    a patch."""
    return Validation(pod, snapshot, policy, namespace=namespace, record_key=record_key).decide(snapshot)


class Validation:
    """`validate` in two steps, so that a server holds a shared lock only for the second: the constructor
    parses and screens the final pod and checks it against its sealed record (everything that reads the
    pod but no node's or namespace's usage: the picture it is given may be a moment older than the next
    step's); `decide(snapshot)` checks the recorded allocation against the namespace's quotas."""

    def __init__(self, pod: Mapping[str, Any], snapshot: Snapshot, policy: Policy, *, namespace: str | None = None,
                 record_key: RecordKey = b"") -> None:
        self.final: Decision | None = None
        self.recorded: Allocation | None = None
        self.namespace = ""
        self.warnings: tuple[str, ...] = ()
        read = read_pod(pod)  # the pod's fields and their types, read once
        if isinstance(read, str):
            self.final = denied(422, "invalid-pod", read)
            return
        request, final, sealed = screen(read, snapshot, policy, namespace, record_key, validating=True)
        if final is not None:
            self.final = after_screen(pod, request, final, snapshot, policy, mutating=False)
        elif sealed is None:
            self.final = denied(403, "not-mutated",
                                f"GPU pod has no {ANNOTATION} annotation: the gpu-admission mutating webhook did not "
                                "process it (it may be unavailable); retry the create")
        else:
            self.final = _against_record(pod, request, sealed, snapshot, policy)
            self.recorded, self.namespace = sealed.allocation, request.namespace
            self.warnings = tuple(warning(w) for w in request.warnings)

    def decide(self, snapshot: Snapshot) -> Decision:
        """The final decision: the recorded allocation against the namespace's quotas in `snapshot`."""
        if self.final is not None or self.recorded is None:
            assert self.final is not None
            return self.final
        recorded = self.recorded
        quota = check_quota(self.namespace, recorded.usage(), snapshot)
        if quota.refusal:
            return refused(quota.refusal, warnings=self.warnings)
        warnings = (*self.warnings, *(warning(w) for w in quota.warnings))
        return allowed("admitted", f"node {recorded.node}" if recorded.node else "admitted", warnings=warnings,
                       allocation=recorded)


def _against_record(pod: Mapping[str, Any], request: PodRequest, sealed: Sealed, snapshot: Snapshot,
                    policy: Policy) -> Decision | None:
    """Why the final pod no longer matches its sealed record (None: it does)."""
    recorded = sealed.allocation
    # A required term is sealed for a default-scheduler pod, and for another scheduler's pod where the
    # namespace's allowedModels restrict it (that scheduler honours node affinity too).
    view = view_for(request)
    if sealed.required is not None and trust.affinity_lacks(view, sealed.required):
        return denied(403, "affinity-changed",
                      f"a required node affinity term lacks the requirement {sealed.required.get('key')} "
                      f"{sealed.required.get('operator')} {sealed.required.get('values')} that the decision "
                      "ANDed into every term: another webhook or the user changed it; resubmit the pod")
    if (sealed.group_required is not None and request.scheduler_name in DEFAULT_SCHEDULERS
            and trust.affinity_lacks(view, sealed.group_required)):
        return denied(403, "affinity-changed",
                      f"a required node affinity term lacks the requirement {sealed.group_required.get('key')} In "
                      f"{sealed.group_required.get('values')} that keeps the pod in its group's domain "
                      f"({recorded.group}): another webhook or the user changed it; resubmit the pod")
    backend = backend_of(request, policy)
    missing = (_missing_limits(request, recorded, backend) or missing_sidecar_void(request)
               or missing_pins(pod, request, recorded, backend, snapshot, policy))
    if missing:
        return denied(403, "limits-missing", missing)
    return None


def _missing_limits(request: PodRequest, allocation: Allocation, backend: str) -> str | None:
    view = view_for(request)
    for c in request.containers:
        if c.gpu is None or c.gpu.count <= 0:
            continue
        container = view.container("initContainers" if c.init else "containers", c.index)
        env = container.env if container is not None else ()
        have = {e.get("name"): e.get("value") for e in env if is_mapping(e) and isinstance(e.get("name"), str)}
        for name, value in limit_env(backend, c.gpu.count, *allocation.slice_of(c.name)):
            if have.get(name) != value:
                return (f"container {c.name} lacks {name}={value} that its allocation requires: another webhook "
                        "removed it; resubmit the pod")
    return None
