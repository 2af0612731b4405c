"""Whether the decision record a pod carries is this webhook's word, and the pod judged without it.

On CREATE a pod may carry `gpu-admission.io/allocation` for two honest reasons: the API server runs the
mutating webhook again on its own output (reinvocationPolicy: IfNeeded), and the validating webhook sees
that output. It may also carry one its author wrote or edited. Only the seal tells them apart (see
record.py), so a record whose seal does not verify is dropped: the pod is decided exactly as the same
pod without it, and the mutation writes a sealed record over it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from webhook.core.domain.decision import Decision, allowed, denied
from webhook.core.domain.podview import PodView
from webhook.core.domain.request import PodRequest
from webhook.core.podspec.coerce import is_mapping, list_of, mapping_of
from webhook.core.podspec.record import ANNOTATION, RecordKey, Sealed, read_sealed, shape_of
from webhook.core.podspec.view import view_for

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def sealed_record(pod: Mapping[str, Any], request: PodRequest, key: RecordKey) -> Sealed | str | None:
    """The pod's record when its seal verifies, None when it carries none, else why it is not ours."""
    raw = view_for(request, pod).annotations.get(ANNOTATION)
    if raw is None:
        return None
    return read_sealed(raw, shape_of(request.namespace, request.containers), key)


def without_record(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod without its record: new metadata and annotations, everything else shared (read-only)."""
    metadata = dict(mapping_of(pod.get("metadata")))
    metadata["annotations"] = {k: v for k, v in mapping_of(metadata.get("annotations")).items() if k != ANNOTATION}
    return {**pod, "metadata": metadata}


def affinity_lacks(pod: Mapping[str, Any] | PodView, required: Mapping[str, Any]) -> bool:
    """True when some required node selector term of the pod (or of its view) does not carry `required`
    (the node requirement the mutation ANDed into every term), so the pod could run on a node it may not
    use."""
    given = pod.affinity if isinstance(pod, PodView) else mapping_of(mapping_of(pod.get("spec")).get("affinity"))
    affinity = mapping_of(given.get("nodeAffinity"))
    terms = list_of(mapping_of(affinity.get(REQUIRED)).get("nodeSelectorTerms"))
    if not terms:
        return True
    field = "matchFields" if required.get("key") == "metadata.name" else "matchExpressions"
    wanted = dict(required)
    return any(not is_mapping(t) or wanted not in list_of(t.get(field)) for t in terms)


MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
NODE_USER_PREFIX = "system:node:"


def is_mirror_pod(pod: Mapping[str, Any], username: str | None) -> bool:
    """A static pod's mirror, which the kubelet of the node it runs on creates (the API server's
    NodeRestriction admits a mirror pod only from that node's identity, `system:node:<name>`). The
    kubelet runs the static pod whatever the API server answers, so refusing the mirror would only hide
    it. Anyone else carrying the annotation gets no pass; `check` knows no requester, so for it no pod is
    a mirror pod, exactly as for the server when a user, not a node, creates the pod."""
    if not username or not username.startswith(NODE_USER_PREFIX):
        return False
    if MIRROR_ANNOTATION not in mapping_of(mapping_of(pod.get("metadata")).get("annotations")):
        return False
    node = mapping_of(pod.get("spec")).get("nodeName")
    return isinstance(node, str) and bool(node) and username == NODE_USER_PREFIX + node


def record_update(pod: Mapping[str, Any], old: Mapping[str, Any]) -> Decision:
    """An UPDATE of a pod: refused when it adds, changes or removes the decision record. The mutation
    writes the record at CREATE only; on a running pod a copy of another pod's sealed record (same
    namespace and GPU shape) would move its usage to other GPUs of the node, so that the GPU it really
    uses looks free."""
    given = mapping_of(mapping_of(pod.get("metadata")).get("annotations")).get(ANNOTATION)
    before = mapping_of(mapping_of(old.get("metadata")).get("annotations")).get(ANNOTATION)
    if given == before:
        return allowed("record-unchanged", gpu_pod=False)
    what = "adds" if before is None else "removes" if given is None else "changes"
    return denied(403, "record-changed", f"this update {what} the pod's {ANNOTATION} annotation, which the GPU "
                  "admission webhook writes when the pod is created and nobody may edit afterwards (it says "
                  "which GPUs the pod holds); leave it as it is")


_UUID_CHARS = frozenset("0123456789abcdefABCDEF-")


def nonce_of(uid: str) -> str:
    """The record's nonce for one admission: the AdmissionReview's uid (a UUID the API server makes for
    each request, so no two pods get one), or a digest of it when it is not a plain UUID."""
    if 0 < len(uid) <= 64 and set(uid) <= _UUID_CHARS:
        return uid
    return hashlib.sha256(uid.encode()).hexdigest()[:32]
