"""A pod UPDATE that could reach a GPU: what a pending pod may still change, judged as at CREATE.

A pod's containers, env and runtime class are fixed once it exists, but until it runs it may gain
tolerations (additions only), a gated pod may gain a nodeSelector or node affinity, and its annotations
may change. Each can hand the pod a GPU that its admission never counted or limited:

- a pod that asked for no GPU and gains a route to a GPU node (a toleration of a GPU taint, every taint)
  must then carry `NVIDIA_VISIBLE_DEVICES=void` in every container, as the mutation would have written at
  CREATE; env cannot change on an UPDATE, so without it the update is refused;
- annotations that ask for a GPU (KAI's `gpu-fraction` / `gpu-memory`) or choose which GPUs a scheduler
  gives (HAMi's `use-gputype` / `use-gpuuuid` and their `nouse-` forms, which Volcano's vGPU plugin reads
  too; the device mode HAMi and Volcano keep devices by, `nvidia.com/vgpu-mode` / `volcano.sh/vgpu-mode`:
  `mig` or `hami-core`) are read at scheduling, after admission: they may not change. What a scheduler
  writes itself when it binds (Volcano's `volcano.sh/gpu-index`, `volcano.sh/vgpu-ids-new`, HAMi's
  `hami.io/vgpu-devices-to-allocate`) is left alone: refusing it would stop that scheduler;
- the decision record may not change (trust.record_update).

A GPU pod may gain tolerations and node constraints: its sealed required affinity is ANDed into every
term, so they only narrow where it may go.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from webhook.core.admission.dra import claim_refs
from webhook.core.admission.no_gpu_reach import NO_GPU_ANSWERS, after_screen
from webhook.core.admission.screen import screen
from webhook.core.admission.trust import record_update
from webhook.core.domain.decision import Decision, allowed, denied
from webhook.core.domain.model import Snapshot
from webhook.core.podspec.coerce import mapping_of
from webhook.core.podspec.dialects import VGPU_MODES
from webhook.core.podspec.kai import KAI_FRACTION, KAI_FRACTION_DEVICES, KAI_MEMORY
from webhook.core.podspec.vendor_table import SELECTORS
from webhook.core.policy.model import Policy

# Annotations read at scheduling that ask for GPUs or choose them: fixed from admission on.
SCHEDULING_ANNOTATIONS: frozenset[str] = frozenset(
    {KAI_FRACTION, KAI_FRACTION_DEVICES, KAI_MEMORY, *VGPU_MODES,
     *(name for names in SELECTORS.values() for name in names)}
)


def pod_update(
    pod: Mapping[str, Any], old: Mapping[str, Any], snapshot: Snapshot, policy: Policy, namespace: str | None = None
) -> Decision:
    """The answer to a pod UPDATE (the validating webhook's; nothing is patched or reserved)."""
    decision = record_update(pod, old)
    if not decision.allowed:
        return decision
    changed = sorted(name for name in SCHEDULING_ANNOTATIONS if _annotation(pod, name) != _annotation(old, name))
    if changed:
        return denied(
            403,
            "gpu-request-changed",
            f"this update changes the annotation {changed[0]}, which asks for GPUs or chooses them when "
            "the pod is scheduled; it is fixed once the pod is admitted: delete and create the pod with "
            "the annotation you want",
        )
    snapshot = _without_own_claims(old, snapshot)
    after = _no_gpu_answer(pod, snapshot, policy, namespace)
    if after is None or after.allowed:
        return decision
    before = _no_gpu_answer(old, snapshot, policy, namespace)
    if before is not None and not before.allowed:
        return decision  # the update opens no route the pod did not have (it predates this webhook)
    return denied(
        after.code,
        after.reason,
        f"this update gives a pod that asks for no GPU a way onto a GPU node: {after.message}; "
        "containers cannot gain env by an update, so create the pod with the toleration or constraint "
        "instead (the webhook then pins NVIDIA_VISIBLE_DEVICES=void), or set "
        "NVIDIA_VISIBLE_DEVICES=void in every container",
    )


def _annotation(pod: Mapping[str, Any], name: str) -> Any:
    return mapping_of(mapping_of(pod.get("metadata")).get("annotations")).get(name)


def _no_gpu_answer(
    pod: Mapping[str, Any], snapshot: Snapshot, policy: Policy, namespace: str | None
) -> Decision | None:
    """What validation would answer this pod at CREATE if it asks for no GPU; None for a GPU pod."""
    request, final, _ = screen(pod, snapshot, policy, namespace, b"", validating=False)
    if final is None or final.reason not in NO_GPU_ANSWERS:
        return None
    answer = after_screen(pod, request, final, snapshot, policy, mutating=False)
    return answer if not answer.allowed else allowed("no-gpu-unchanged", gpu_pod=False)


def _without_own_claims(pod: Mapping[str, Any], snapshot: Snapshot) -> Snapshot:
    """The snapshot as this pod's CREATE saw it: the pod is live now, so it is among the holders of its
    own claims (`claim_users`), and a claim only it holds would read as shared with another pod and
    count no GPU for it (core/admission/dra.py)."""
    refs = claim_refs(pod)
    if not refs:
        return snapshot
    namespace = str(mapping_of(pod.get("metadata")).get("namespace") or "default")
    table = dict(snapshot.claim_users.get(namespace, {}))
    for ref in set(refs):
        if table.get(ref, 0) > 0:
            table[ref] -= 1
    return replace(snapshot, claim_users={**snapshot.claim_users, namespace: table})
