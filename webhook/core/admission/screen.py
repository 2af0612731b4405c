"""The checks of a GPU pod that need no placement: parsing, the decision record's trust, isolation, policy.

`screen` returns the request, a final decision when one is already reached (allowed-unmanaged or denied), and
the pod's record when this webhook sealed it; mutate and validate go on to placement only without one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.domain.decision import Decision, allowed, denied, refused, warning
from webhook.core.domain.model import Allocation, Snapshot
from webhook.core.domain.names import GPU_PRODUCT_LABEL
from webhook.core.domain.podview import PodView
from webhook.core.domain.request import PodRequest
from webhook.core.podspec import patch as patches
from webhook.core.podspec.accelerators import foreign_accelerators
from webhook.core.podspec.coerce import list_of
from webhook.core.podspec.limits import is_limit_env, is_sm_device_env, limit_env
from webhook.core.podspec.record import ANNOTATION, RecordKey, Sealed
from webhook.core.podspec.resources import parse_pod
from webhook.core.podspec.vendor_table import enforced_backend, kept_for_scheduler
from webhook.core.podspec.view import view_for
from webhook.core.policy.model import Policy

from . import dra, node_routes, trust
from .envfrom import screen_gpu
from .no_gpu_reach import FOREIGN_ACCELERATOR
from .rules import check_policy, matches_model, whole_cards
from .scope import is_managed

MAX_VIOLATIONS = 5  # a denial names this many; a pod of 20,000 bad containers gets a short message


def _violations_message(request: PodRequest) -> str:
    shown = [v.message for v in request.violations[:MAX_VIOLATIONS]]
    more = len(request.violations) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _env_mismatch(request: PodRequest, allocation: Allocation, backend: str) -> str | None:
    """A limit variable in the pod that differs from what the allocation dictates (a lifted limit)."""
    view = view_for(request)
    for c in request.containers:
        container = patches.container_of(view, c)
        count = c.gpu.count if c.gpu else 0
        wanted = dict(limit_env(backend, count, *allocation.slice_of(c.name)))
        for env in container.env:
            if not is_limit_env(str(env.get("name", ""))):
                continue
            name = str(env.get("name"))
            # A per-device compute limit is a pin of the container's own cap (envfrom.pin_ops).
            expected = wanted.get(name, wanted.get("CUDA_DEVICE_SM_LIMIT") if is_sm_device_env(name) else None)
            if expected != env.get("value") or "valueFrom" in env:
                return (f"container {c.name} sets {name}={env.get('value')!r}, which this product manages "
                        f"(allocation: {allocation.memory_mib} MiB, {allocation.cores}% per GPU): remove it")
    return None


def _kept_mismatch(request: PodRequest, recorded: Allocation) -> str | None:
    """What in the pod's resources disagrees with the recorded decision. A default-scheduler pod must
    carry no slice resource any more (the first pass moved them all); a pod of a scheduler that reads
    them keeps them, and their figures must still be the recorded ones."""
    kept = request.scheduler_name
    for c in request.containers:
        for name in c.moved_resources:
            if not kept_for_scheduler(kept, name):
                return f"GPU memory/compute resource {name}"
    for c in request.containers:
        if c.gpu is None or not c.moved_resources:
            continue
        memory, cores = recorded.slice_of(c.name)
        if c.gpu.memory_mib is not None and c.gpu.memory_mib != memory:
            return f"{c.gpu.memory_mib} MiB of GPU memory in {c.name!r}, not the recorded {memory}"
        if c.gpu.cores is not None and c.gpu.cores != cores:
            return f"{c.gpu.cores}% of GPU compute in {c.name!r}, not the recorded {cores}%"
    return None


def _stale_models(recorded: Allocation, required: Mapping[str, Any] | None, snapshot: Snapshot,
                  allowed_models: tuple[str, ...]) -> str | None:
    """A GPU model the record places the pod on that the namespace's allowedModels no longer admit (a
    record sealed before the policy changed, or copied from such a pod): the recorded model, any model
    its required term lets the scheduler choose, and the model of any node that term names."""
    if not allowed_models:
        return None
    models = [recorded.model]
    values = [v for v in list_of((required or {}).get("values")) if isinstance(v, str)]
    if (required or {}).get("key") == GPU_PRODUCT_LABEL:
        models += values
    else:  # a list of node names: the model of each
        models += [n.gpu_model for name in values if (n := snapshot.nodes.get(name)) is not None]
    return next((m for m in models if m and not matches_model(m, allowed_models)), None)


def screen(pod: Mapping[str, Any] | PodView, snapshot: Snapshot, policy: Policy, namespace: str | None,
           key: RecordKey, validating: bool = False) -> tuple[PodRequest, Decision | None, Sealed | None]:
    """Parse and apply every check that needs no placement. Returns the request, a final decision when
    one is already reached (allowed-unmanaged or denied), and the pod's record if this webhook sealed it.
    A record the webhook did not seal is dropped: the pod is judged exactly as the same pod without it,
    except that validation names the record when it refuses a GPU pod for lacking one."""
    request = node_routes.screen(dra.with_claims(parse_pod(pod, namespace), snapshot, policy), snapshot)
    pod = request.raw  # the view, when given one, is the request's (PodRequest.view)
    sealed = trust.sealed_record(pod, request, key)
    if isinstance(sealed, str):
        why, sealed, pod = sealed, None, trust.without_record(pod)
        request = node_routes.screen(dra.with_claims(parse_pod(pod, namespace), snapshot, policy), snapshot)
        if validating and request.is_gpu_pod and request.gpus > 0 and is_managed(request.namespace, snapshot, policy):
            return request, denied(403, "annotation-not-sealed",
                                  f"the pod's {ANNOTATION} annotation is not this webhook's: {why}; remove it and "
                                  "resubmit (the mutating webhook writes it)"), None
    if not request.is_gpu_pod:
        # Accelerators outside the vendor table pass, with the warning that nothing counts or limits them,
        # and an answer that says so: the pod asks for an accelerator, only not one of this controller's.
        warned = tuple(warning(w) for w in request.warnings)
        foreign = foreign_accelerators(view_for(request))
        if foreign:
            return request, allowed(FOREIGN_ACCELERATOR,
                                    f"asks for {', '.join(foreign)}, which this controller does not count or "
                                    "limit: unchanged", gpu_pod=False, warnings=warned), None
        return request, allowed("not-gpu-pod", gpu_pod=False, warnings=warned), None
    if not is_managed(request.namespace, snapshot, policy):
        return request, allowed("not-managed", f"namespace {request.namespace} is not managed", managed=False), None
    request = screen_gpu(pod, request, snapshot, policy)  # envFrom
    if request.violations:
        first = request.violations[0]
        return request, denied(first.code, first.rule, _violations_message(request)), None
    if request.gpus <= 0:
        # Names a GPU resource but asks for none of it (`nvidia.com/gpu: 0`): the device plugin gives it
        # no device, so there is nothing to limit or place; the isolation rules above still applied.
        return request, allowed("no-gpu-requested", "asks for 0 GPUs: unchanged"), None
    if request.node_name:
        return request, denied(403, "node-name-set",
                              f"sets spec.nodeName={request.node_name}, which bypasses GPU admission and the "
                              "scheduler: remove spec.nodeName and use a nodeSelector or node affinity"), None
    recorded = sealed.allocation if sealed is not None else None
    if recorded is not None:
        if (recorded.gpu_count != request.gpus or recorded.vendor != request.vendor
                or recorded.mig != request.mig):
            return request, denied(403, "annotation-mismatch",
                                  f"pod asks for {request.gpus} {request.vendor} GPU(s) but its {ANNOTATION} "
                                  f"records {recorded.gpu_count} {recorded.vendor}: another webhook or the user "
                                  "changed it; remove the annotation and resubmit"), None
        stale = _stale_models(recorded, sealed.required if sealed else None, snapshot,
                              policy.rule(request.namespace).allowed_models)
        if stale:
            return request, denied(403, "record-stale",
                                  f"the pod's {ANNOTATION} places it on GPU model {stale}, which namespace "
                                  f"{request.namespace} may no longer use (policy namespaces.{request.namespace}."
                                  "allowedModels): remove the annotation and resubmit, so that the pod is placed "
                                  "under the current policy"), None
        changed = _kept_mismatch(request, recorded)
        if changed:
            return request, denied(403, "annotation-mismatch",
                                  f"pod carries {changed} next to its {ANNOTATION}: another "
                                  "webhook or the user changed it; remove the annotation and resubmit"), None
        # The annotation is where the first pass moved memory and compute; it is the request now.
        request = request.evolve(memory_mib=recorded.memory_mib, memory_pct=None, cores=recorded.cores)
        mismatch = _env_mismatch(request, recorded, backend_of(request, policy))
        if mismatch:
            return request, denied(403, "isolation-env", mismatch), sealed
    if recorded is not None and whole_cards(recorded, snapshot):  # not a slice, though memory is recorded
        denial = check_policy(request.evolve(memory_mib=None, memory_pct=None, cores=100), policy)
    else:
        denial = check_policy(request, policy)
    if denial:
        return request, refused(denial), sealed
    return request, None, sealed


def backend_of(request: PodRequest, policy: Policy) -> str:
    """The namespace's limit backend where it applies: none for MIG devices and non-CUDA vendors."""
    return enforced_backend(request.vendor, request.mig, policy.backend_for(request.namespace))
