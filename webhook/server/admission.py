"""From a parsed review to the answer: the fast path, the call into the core, metrics and the log line.

Nothing here knows about Flask; `app.py` hands in the body and content type and sends back what
`AdmissionHandler.handle` returns. An exception from the core becomes a denial with code 500: the
process never dies on a request.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from webhook.core.admission.trust import is_mirror_pod, nonce_of, record_update
from webhook.core.admission.updates import pod_update
from webhook.core.domain.decision import Decision, allowed
from webhook.core.domain.names import ALLOCATION
from webhook.core.domain.names import GROUP as INVENTORY_GROUP
from webhook.core.domain.names import INVENTORY_PLURAL as INVENTORY_RESOURCE
from webhook.core.placement.group_place import placed_here
from webhook.core.podspec.record import record_nonce
from webhook.core.podspec.workload import describe as describe_workload
from webhook.policyfile.holder import PolicyHolder

from . import review as rv
from .logs import ADMISSION_LOGGER, admission_fields, log_admission
from .metrics import AdmissionMetrics
from .source import SnapshotSource

log = logging.getLogger(ADMISSION_LOGGER)

CLAIM_GROUP = "resource.k8s.io"
CLAIM_RESOURCES = ("resourceclaims", "resourceclaimtemplates")
ALWAYS_EXCLUDED = ("kube-system",)
HTTP_REASONS = {400: "BadRequest", 408: "Timeout", 413: "RequestEntityTooLarge", 415: "UnsupportedMediaType",
                503: "ServiceUnavailable"}


@dataclass(frozen=True)
class AdmissionCore:
    """The decision functions the server calls; injectable so the HTTP layer can be tested alone."""

    mutate: Callable[..., Decision]
    validate: Callable[..., Decision]
    # Whether a pod CREATE needs the core at all (a GPU named, a claim, an accelerator, a device-list
    # mount): the rest pass on the fast path.
    needs_decision: Callable[[Mapping[str, Any]], bool]
    check_inventory_write: Callable[[Mapping[str, Any]], Decision]
    # ResourceClaim / ResourceClaimTemplate writes: (request, snapshot, policy) -> Decision; None: allowed.
    check_claim: Callable[..., Decision] | None = None
    # UPDATE of pods/ephemeralcontainers: (pod, old pod, snapshot, policy, namespace=, mutating=) -> Decision.
    ephemeral: Callable[..., Decision] | None = None
    # ConfigMap writes: (request, snapshot, policy) -> Decision; None: allowed.
    check_config_map: Callable[..., Decision] | None = None
    # mutate takes nonce= (from the review's uid), which the decision record carries (core/trust.py).
    mutate_nonce: bool = False
    # Pod UPDATEs: (pod, old pod, snapshot, policy, namespace=) -> Decision; None: only record edits refused.
    pod_update: Callable[..., Decision] | None = None
    # mutate and validate in steps (core/admission/admit.py `Mutation`, `Validation`): made from (pod,
    # snapshot, policy, namespace=[, nonce=]) before any shared lock, only their `decide(snapshot)` runs
    # under the source's plan or commit lock; None: the whole decision runs under it.
    staged_mutate: Callable[..., Any] | None = None
    staged_validate: Callable[..., Any] | None = None


def real_core(record_key: bytes | tuple[bytes, ...] | None = None) -> AdmissionCore:
    """The allocation core's entry points (imported here, not at module load), sealing decision records
    with `record_key` (None: a random key, good for this process only; `serve` passes the chart's Secret)."""
    from functools import partial

    from webhook.core.admission import admit
    from webhook.core.admission.configmap_writes import config_map_write
    from webhook.core.admission.dra import names_claims
    from webhook.core.admission.dra_objects import check_claim_object
    from webhook.core.admission.ephemeral import ephemeral
    from webhook.core.admission.node_routes import device_list_mounts
    from webhook.core.podspec.fastpath import needs_decision

    # Not only GPU pods: one asking for an accelerator outside the vendor table gets a warning from the core,
    # one naming DRA claims has their GPUs counted, and one mounting a toolkit device list is refused.
    def decided(pod: Mapping[str, Any]) -> bool:
        return needs_decision(pod) or names_claims(pod) or bool(device_list_mounts(pod))

    key = secrets.token_bytes(32) if record_key is None else record_key
    return AdmissionCore(
        partial(admit.mutate, record_key=key),
        partial(admit.validate, record_key=key),
        decided,
        _check_inventory_write,
        check_claim_object,
        ephemeral,
        config_map_write,
        mutate_nonce=True,
        pod_update=pod_update,
        staged_mutate=partial(admit.Mutation, record_key=key),
        staged_validate=partial(admit.Validation, record_key=key),
    )


def _check_inventory_write(request: Mapping[str, Any]) -> Decision:
    try:
        from webhook.core.admission.inventory_guard import check_inventory_write
    except ImportError:
        return allowed("inventory-guard-unavailable", gpu_pod=False)
    return check_inventory_write(request)


class Answer(NamedTuple):
    """What goes back over HTTP: a status and a JSON body (or the bytes another replica answered)."""

    http_status: int
    body: Mapping[str, Any]
    raw: bytes | None = None


class _Outcome(NamedTuple):
    response: rv.AdmissionResponse
    verdict: str
    reason: str
    code: int


class AdmissionHandler:
    def __init__(
        self,
        *,
        source: SnapshotSource,
        policy: PolicyHolder,
        core: AdmissionCore,
        metrics: AdmissionMetrics,
        namespace: str,
    ) -> None:
        self.source = source
        self.policy = policy
        self.core = core
        self.metrics = metrics
        self.excluded_namespaces = frozenset((*ALWAYS_EXCLUDED, namespace))
        # With an elected decider (cluster/leader.py): the client forwarding reviews to it, and the key
        # that signs them (the record key every replica holds); set by the app.
        self.peer: Any = None
        self.peer_key: bytes | tuple[bytes, ...] | None = None
        self._children: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    def handle(
        self, endpoint: str, content_type: str | None, body: bytes, declared_length: int | None = None
    ) -> Answer:
        """Answer one request. `declared_length` (Content-Length) lets an oversized body be refused unread."""
        started = time.perf_counter()
        in_flight = self.metrics.in_flight
        in_flight.append(None)
        try:
            return self._handle(endpoint, content_type, body, declared_length, started)
        finally:
            in_flight.pop()

    def _handle(
        self,
        endpoint: str,
        content_type: str | None,
        body: bytes,
        declared_length: int | None,
        started: float,
    ) -> Answer:
        try:
            rv.check_content_type(content_type)
            rv.check_length(declared_length)
            incoming = rv.parse_review(body)
        except rv.ReviewError as err:
            return self._bad_request(endpoint, "", err, started)
        try:
            outcome = self._decide(endpoint, incoming)
        except rv.ReviewError as err:
            return self._bad_request(endpoint, incoming.uid, err, started)
        except Exception:
            self.metrics.errors.labels(endpoint).inc()
            log.exception("unexpected error while deciding", extra={"endpoint": endpoint, "uid": incoming.uid})
            message = f"internal error in the GPU admission webhook (request uid {incoming.uid}); see its log"
            outcome = _Outcome(rv.errored(incoming.uid, 500, message), "error", "internal-error", 500)
        elapsed = time.perf_counter() - started
        self._count(endpoint, outcome, elapsed)
        request = incoming.request
        pod = _mapping(request.get("object"))
        metadata = _mapping(pod.get("metadata"))
        fields = admission_fields(
            uid=incoming.uid,
            namespace=_text(request.get("namespace")) or _text(metadata.get("namespace")),
            pod=_text(metadata.get("name")) or _text(metadata.get("generateName")) or _text(request.get("name")),
            operation=_text(request.get("operation")),
            endpoint=endpoint,
            verdict=outcome.verdict,
            reason=outcome.reason,
            code=outcome.code,
            duration_ms=elapsed * 1000.0,
            dry_run=incoming.dry_run,
        )
        workload = describe_workload(_mapping(metadata.get("labels")))  # "PyTorchJob train/worker/3"
        if workload:
            fields["workload"] = workload
        log_admission(log, fields)
        return Answer(200, rv.envelope(incoming.api_version, outcome.response))

    def _count(self, endpoint: str, outcome: _Outcome, seconds: float) -> None:
        """Duration and decision metrics. The labelled children are kept per label set, because
        `labels()` takes a lock and builds a key on every call; reasons are a small fixed set."""
        key = (endpoint, outcome.verdict, outcome.reason)
        children = self._children.get(key)
        if children is None:
            children = (
                self.metrics.duration.labels(endpoint, outcome.verdict),
                self.metrics.decisions.labels(endpoint, outcome.verdict, outcome.reason),
            )
            self._children[key] = children
        children[0].observe(seconds)
        children[1].inc()

    def unreadable(self, endpoint: str, err: OSError) -> Answer:
        """408: the body never arrived whole. Counted and logged like any other bad request."""
        reason = f"request body not received in full: {err.strerror or err}"
        return self._bad_request(endpoint, "", rv.ReviewError(408, reason), time.perf_counter())

    def unavailable(self, endpoint: str, reason: str) -> Answer:
        """503: no replica can decide now (a decider is being elected, or cannot be reached). The API server
        then applies the webhook's failurePolicy; a pod's controller tries again."""
        self.metrics.bad_requests.labels(endpoint, "503").inc()
        log.warning("unavailable: %s", reason, extra={"endpoint": endpoint, "code": 503})
        return Answer(503, _status_body(503, reason))

    def forbidden(self, endpoint: str, reason: str) -> Answer:
        """A caller that may not post reviews at all: answered before the body is read."""
        self.metrics.duration.labels(endpoint, "rejected").observe(0.0)
        log.warning("refused: %s", reason, extra={"endpoint": endpoint, "code": 403})
        return Answer(403, _status_body(403, reason))

    def _bad_request(self, endpoint: str, uid: str, err: rv.ReviewError, started: float) -> Answer:
        self.metrics.bad_requests.labels(endpoint, str(err.http_status)).inc()
        self.metrics.duration.labels(endpoint, "rejected").observe(time.perf_counter() - started)
        log.warning(
            "bad admission request: %s",
            err.reason,
            extra={"endpoint": endpoint, "uid": uid, "code": err.http_status},
        )
        return Answer(err.http_status, _status_body(err.http_status, err.reason))

    def _decide(self, endpoint: str, incoming: rv.IncomingReview) -> _Outcome:
        """The request goes to the handler of what it writes (`_ROUTES`, by group, resource and subresource)."""
        return getattr(self, _route(incoming.request))(endpoint, incoming)

    def _inventory(self, endpoint: str, incoming: rv.IncomingReview) -> _Outcome:
        """A GPUInventory written: only the node's own agent may publish its GPUs (core/inventory_guard.py)."""
        if endpoint == "validate":
            return _from_decision(incoming.uid, self.core.check_inventory_write(incoming.request), with_patch=False)
        return _fast(incoming.uid, "not-a-pod")

    def _other(self, endpoint: str, incoming: rv.IncomingReview) -> _Outcome:
        """Anything else the configurations send (a subresource, another kind): nothing to decide."""
        return _fast(incoming.uid, "not-create" if incoming.request.get("operation") != "CREATE" else "not-a-pod")

    def _pod(self, endpoint: str, incoming: rv.IncomingReview) -> _Outcome:
        """A pod CREATE is decided (and reserved, when validated); a pod UPDATE goes to `_record_update`."""
        request = incoming.request
        uid = incoming.uid
        if request.get("operation") == "UPDATE" and endpoint == "validate":
            return self._record_update(incoming)
        if request.get("operation") != "CREATE":
            return _fast(uid, "not-create")
        pod = request.get("object")
        if not isinstance(pod, dict):
            raise rv.ReviewError(400, "missing request.object: a pod CREATE must carry the pod")
        metadata = _mapping(pod.get("metadata"))
        namespace = _namespace_of(request, metadata)
        if namespace in self.excluded_namespaces:
            return _fast(uid, "excluded-namespace")
        # Only the kubelet of the pod's own node passes with a mirror pod; anyone else is decided by the
        # core like any pod (and like `check`, which knows no requester).
        if is_mirror_pod(pod, _text(_mapping(request.get("userInfo")).get("username"))):
            return _fast(uid, "mirror-pod")
        if not self.core.needs_decision(pod):
            return _fast(uid, "no-gpu-request")
        policy = self.policy.get()
        if endpoint == "mutate":
            extra = {"nonce": nonce_of(uid)} if self.core.mutate_nonce else {}
            mutate = self.core.mutate
            plan = getattr(self.source, "plan", None)  # a live source holds each plan's GPUs until validation
            if plan is None:
                decision = mutate(pod, self.source.snapshot(), policy, namespace=namespace or None, **extra)
            elif self.core.staged_mutate is not None:
                # Parsed, screened and patched outside the plan lock, which other namespaces' pods wait for:
                # under it only the placement and the quota.
                staged = self.core.staged_mutate(pod, self.source.snapshot(), policy, namespace=namespace or None,
                                                 **extra)
                decision = staged.finish(plan(staged.decide, extra.get("nonce", ""), incoming.dry_run))
            else:
                decision = plan(lambda snapshot: mutate(pod, snapshot, policy, namespace=namespace or None, **extra),
                                extra.get("nonce", ""), incoming.dry_run)
            return _from_decision(uid, decision, with_patch=True)
        pod_uid = _text(metadata.get("uid")) or uid
        validate = self.core.validate

        def whole(snapshot: Any) -> Decision:
            return validate(pod, snapshot, policy, namespace=namespace or None)

        decide: Callable[[Any], Decision] = whole
        if self.core.staged_validate is not None:  # parsed and screened before the commit lock is taken
            decide = self.core.staged_validate(pod, self.source.snapshot(), policy, namespace=namespace or None).decide

        # The pod goes with its reservation: what it reads through envFrom is checked at a ConfigMap write
        # before the watch shows the pod (read from it only when a reservation is taken).
        group = placed_here(pod, namespace, policy)
        if group is None:
            decision = self.source.commit(pod_uid, namespace, decide, incoming.dry_run, pod=pod)
        else:  # its group's record is written with the reservation (a source that keeps groups)
            decision = self.source.commit(pod_uid, namespace, decide, incoming.dry_run, group=group, pod=pod)
        release = getattr(self.source, "release", None)
        if release is not None and not incoming.dry_run:
            # its reservation (if admitted) now holds what its plan held
            release(record_nonce(_mapping(metadata.get("annotations")).get(ALLOCATION)))
        return _from_decision(uid, decision, with_patch=False)

    def _record_update(self, incoming: rv.IncomingReview) -> _Outcome:
        """A pod UPDATE (the chart sends those that touch the decision record, tolerations, node constraints
        or the annotations read at scheduling): judged by core/updates.py."""
        request, uid = incoming.request, incoming.uid
        pod, old = request.get("object"), request.get("oldObject")
        if not isinstance(pod, dict):
            raise rv.ReviewError(400, "missing request.object: a pod UPDATE must carry the pod")
        if _namespace_of(request, _mapping(pod.get("metadata"))) in self.excluded_namespaces:
            return _fast(uid, "excluded-namespace")
        namespace = _namespace_of(request, _mapping(pod.get("metadata")))
        old = old if isinstance(old, dict) else {}  # the API server always sends it
        if self.core.pod_update is None:
            decision = record_update(pod, old)
        else:
            decision = self.core.pod_update(
                pod, old, self.source.snapshot(), self.policy.get(), namespace=namespace or None
            )
        return _fast(uid, "not-create") if decision.allowed else _from_decision(uid, decision, with_patch=False)

    def _claim(self, endpoint: str, incoming: rv.IncomingReview) -> _Outcome:
        """A DRA claim or claim template written in a namespace: refused when its GPUs could never be
        counted (core/dra_objects.py). Only the validating webhook decides; nothing is reserved."""
        request, uid = incoming.request, incoming.uid
        namespace = _text(request.get("namespace"))
        if (
            endpoint != "validate"
            or self.core.check_claim is None
            or request.get("operation") not in ("CREATE", "UPDATE")
        ):
            return _fast(uid, "not-a-pod")
        if namespace in self.excluded_namespaces:
            return _fast(uid, "excluded-namespace")
        if not isinstance(request.get("object"), dict):
            raise rv.ReviewError(400, "missing request.object: a claim CREATE or UPDATE must carry the claim")
        decision = self.core.check_claim(request, self.source.snapshot(), self.policy.get())
        return _from_decision(uid, decision, with_patch=False)

    def _config_map(self, endpoint: str, incoming: rv.IncomingReview) -> _Outcome:
        """A ConfigMap written in a namespace: refused when a live GPU pod reads it through envFrom and the
        new data would give it a device or limit variable at its next container start
        (core/admission/configmap_writes.py).
        The pods are those the watch shows and those admitted but not shown yet (their reservations carry
        their reads; a ledger shared by replicas is read again first). Only the validating webhook
        decides; nothing is reserved, so a dry run is decided alike."""
        request, uid = incoming.request, incoming.uid
        if (
            endpoint != "validate"
            or self.core.check_config_map is None
            or request.get("operation") not in ("CREATE", "UPDATE")
        ):
            return _fast(uid, "not-a-pod")
        config_map = request.get("object")
        if not isinstance(config_map, dict):
            raise rv.ReviewError(400, "missing request.object: a ConfigMap CREATE or UPDATE must carry it")
        namespace = _namespace_of(request, _mapping(config_map.get("metadata")))
        if namespace in self.excluded_namespaces:
            return _fast(uid, "excluded-namespace")
        decision = self.core.check_config_map(
            request, self.source.fresh_snapshot(namespace or "default"), self.policy.get()
        )
        return _from_decision(uid, decision, with_patch=False)

    def _ephemeral(self, endpoint: str, incoming: rv.IncomingReview) -> _Outcome:
        """`kubectl debug` adds ephemeral containers by an UPDATE of pods/ephemeralcontainers whose object
        is the whole pod: the added containers are held to the isolation rules (core/admission/ephemeral.py)."""
        request, uid = incoming.request, incoming.uid
        pod = request.get("object")
        if self.core.ephemeral is None or request.get("operation") != "UPDATE":
            return _fast(uid, "not-create")
        if not isinstance(pod, dict):
            raise rv.ReviewError(400, "missing request.object: an ephemeralcontainers UPDATE must carry the pod")
        namespace = _namespace_of(request, _mapping(pod.get("metadata")))
        if namespace in self.excluded_namespaces:
            return _fast(uid, "excluded-namespace")
        old = request.get("oldObject")
        decision = self.core.ephemeral(
            pod,
            old if isinstance(old, dict) else None,
            self.source.snapshot(),
            self.policy.get(),
            namespace=namespace or None,
            mutating=endpoint == "mutate",
        )
        return _from_decision(uid, decision, with_patch=endpoint == "mutate")


def _namespace_of(request: Mapping[str, Any], metadata: Mapping[str, Any]) -> str:
    """The request's namespace, else the object's own (a request may leave it out)."""
    return _text(request.get("namespace")) or _text(metadata.get("namespace"))


def _fast(uid: str, reason: str) -> _Outcome:
    return _Outcome(rv.allowed(uid), "allowed", reason, 200)


def _from_decision(uid: str, decision: Decision, *, with_patch: bool) -> _Outcome:
    if decision.allowed:
        response = rv.patched(uid, decision.patch) if with_patch else rv.allowed(uid)
        verdict, code = "allowed", 200
    else:
        code = decision.code if 400 <= decision.code <= 599 else 403
        response = rv.denied(uid, code, decision.message, decision.reason)
        verdict = "denied"
    return _Outcome(rv.with_warnings(response, decision.warnings), verdict, decision.reason, code)


# Which handler of AdmissionHandler takes a request, by (group, resource, subresource) of what it writes;
# "*" for any subresource. Anything else is `_other`.
_ROUTES: dict[tuple[str, str, str], str] = {
    ("", "pods", ""): "_pod",
    ("", "pods", "ephemeralcontainers"): "_ephemeral",
    ("", "configmaps", ""): "_config_map",
    **{(CLAIM_GROUP, resource, ""): "_claim" for resource in CLAIM_RESOURCES},
    (INVENTORY_GROUP, INVENTORY_RESOURCE, "*"): "_inventory",
}


def _route(request: Mapping[str, Any]) -> str:
    sub = _text(request.get("subResource"))
    resource = request.get("resource")
    if isinstance(resource, dict):
        group, name = _text(resource.get("group")), _text(resource.get("resource"))
    else:  # a request that names no resource: a pod by its kind, as older clients sent it
        kind = request.get("kind")
        named = (kind.get("group"), kind.get("kind")) if isinstance(kind, dict) else (
            "", _mapping(request.get("object")).get("kind"))
        group, name = "", "pods" if named == ("", "Pod") else ""
    return _ROUTES.get((group, name, sub)) or _ROUTES.get((group, name, "*")) or "_other"


def _status_body(http_status: int, reason: str) -> dict[str, Any]:
    """A Kubernetes `Status` object, the API machinery's own shape for an HTTP error."""
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": http_status,
        "reason": HTTP_REASONS.get(http_status, "BadRequest"),
        "message": reason,
    }


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
