"""What one GPU pod holds, read only from fields its owner cannot edit, and where on its node it sits."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.admission.configmap_readers import TERMINAL_PHASES
from webhook.core.domain.model import Allocation, GpuUsage, Node
from webhook.core.domain.names import ALLOCATION
from webhook.core.podspec.coerce import mapping_of
from webhook.core.podspec.record import allocation_from_json
from webhook.core.podspec.resources import parse_pod

from .held import env_share_of, held_of, record_nonce, without_share_annotations


@dataclass(frozen=True)
class PodUsage:
    """What one running (or admitted, not yet finished) GPU pod holds.

    `gpus`: GPU indices on `node` when the decision annotation recorded them, else None (the snapshot
    assigns the node's least-used GPUs). `memory_mib`/`memory_pct` None: the whole card.
    """

    namespace: str
    node: str | None
    gpus: tuple[int, ...] | None
    count: int
    memory_mib: int | None
    memory_pct: int | None
    cores: int
    cpu_milli: int
    memory_mib_host: int
    vendor: str = "nvidia"
    mig: str = ""  # MIG profile: the pod holds MIG devices, no card
    nonce: str = ""  # of the record whose GPU indices `gpus` are (held.repeated)

    @property
    def exclusive(self) -> bool:
        return self.memory_mib is None and self.memory_pct is None and self.cores >= 100

    def memory_on(self, card_mib: int) -> int:
        """Per-GPU memory on a card of `card_mib` MiB."""
        if self.memory_mib is not None:
            return self.memory_mib
        if self.memory_pct is not None:
            return card_mib * self.memory_pct // 100
        return card_mib


def pod_usage_of(pod: Mapping[str, Any]) -> PodUsage | None:
    """What a pod holds, from fields its owner cannot edit once it exists; None when it holds no GPU.

    How many GPUs: its resources (extended resources are immutable). How much of each: the limit
    variables in its containers' env (immutable, and what the limit layer enforces; see held.py), else
    the slice its resources ask for, else whole cards. Which node: spec.nodeName (immutable once bound).
    The decision annotation, which anyone allowed to update the pod can edit, only says which GPUs of
    that node (or, while pending, which node), and only when it agrees with the pod's GPU count and
    vendor: an edit can move the pod's usage between GPUs of its node, never change how much it counts.
    """
    status, spec, metadata = (mapping_of(pod.get(k)) for k in ("status", "spec", "metadata"))
    if status.get("phase") in TERMINAL_PHASES:
        return None
    # KAI's share annotations are editable: the count comes from resources, else from the per-device
    # limit variables (kai-scheduler pods), and only a pod with neither is read from the annotation.
    request = parse_pod(without_share_annotations(pod))
    from_env = env_share_of(request) if request.gpus <= 0 else None
    if from_env is not None:
        request = request.evolve(gpus=from_env[0], vendor="nvidia")
    elif request.gpus <= 0:
        request = parse_pod(pod)
    if request.gpus <= 0:
        return None
    vendor = request.vendor or "nvidia"
    held = from_env[1] if from_env is not None else held_of(request)
    if held is not None:
        memory_mib, memory_pct, cores = held.memory_mib, None, held.cores
    else:
        shared = request.memory_mib is not None or request.memory_pct is not None
        memory_mib, memory_pct = request.memory_mib, request.memory_pct
        cores = request.cores if request.cores is not None else (0 if shared else 100)
    node_name = spec.get("nodeName") if isinstance(spec.get("nodeName"), str) and spec.get("nodeName") else None
    node, indices = node_name, None
    recorded = _recorded_placement(mapping_of(metadata.get("annotations")).get(ALLOCATION))
    if recorded is not None and recorded.gpu_count == request.gpus and (recorded.vendor or "nvidia") == vendor:
        node = node_name or recorded.node
        if recorded.node == node and len(recorded.gpus) == request.gpus and len(set(recorded.gpus)) == request.gpus:
            indices = recorded.gpus
    nonce = record_nonce(mapping_of(metadata.get("annotations")).get(ALLOCATION)) if indices is not None else ""
    return PodUsage(request.namespace, node, indices, request.gpus, memory_mib, memory_pct, cores,
                    request.cpu_milli, request.memory_mib_host, vendor, request.mig, nonce)


def _recorded_placement(raw: object) -> Allocation | None:
    """The decision annotation when it parses (its node and GPU indices are all that is read of it)."""
    if not isinstance(raw, str):
        return None
    try:
        return allocation_from_json(json.loads(raw))
    except (ValueError, TypeError, RecursionError):
        return None


def place_usage(node: Node, gpus: list[GpuUsage], use: PodUsage) -> None:
    """Add a pod's usage to a node's GPUs: the recorded ones, else the least used (deterministic). A pod
    of MIG devices holds none of the node's cards."""
    if use.mig:
        return
    positions = {gpu.index: p for p, gpu in enumerate(node.gpus)}
    chosen = [positions[i] for i in use.gpus or () if i in positions]
    if len(chosen) != use.count or len(set(chosen)) != len(chosen):
        order = sorted(
            range(len(gpus)),
            key=lambda p: (gpus[p].exclusive, gpus[p].cores, gpus[p].memory_mib, gpus[p].tasks, p),
        )
        chosen = order[: use.count]
    for p in chosen:
        g, card = gpus[p], node.gpus[p].memory_mib
        memory = use.memory_on(card)
        whole = use.exclusive or (use.cores >= 100 and memory >= card)
        gpus[p] = GpuUsage(g.memory_mib + memory, g.cores + use.cores, g.tasks + 1, g.exclusive or whole)
