"""NVIDIA MIG devices: what a node offers per profile, and where a pod asking for them may go.

A MIG device (`nvidia.com/mig-3g.20gb`, the device plugin's "mixed" strategy) is a hardware partition of
a card: its memory and SMs are fixed by the profile, so no limit variable is written for it, and the
kubelet hands out whole devices of the profile the pod names. The webhook's part is to send the pod only
to nodes that offer that profile and that the pod can reach, to refuse it (422, naming the profile) when
there are none, and to record the profile's memory, which quota counts instead of a whole GPU.

Where a node's offer comes from, in order: its allocatable `nvidia.com/mig-<profile>` (what the kubelet
will actually give), GPU Feature Discovery's labels `nvidia.com/mig-<profile>.count` and `.memory` (MiB,
NVML's `memorySizeMB` of the device), and the node agent's inventory (`migDevices` per GPU). The memory
of a profile is the label's or the inventory's figure; only when neither gives one, the name's (`20gb`:
20480 MiB).

Other resources NVIDIA's device plugin advertises under a name of their own are decided the same way,
keyed by that name: time-slicing or MPS replicas (`nvidia.com/gpu.shared`, renameByDefault), a renamed
resource (`nvidia.com/gpu-10gb`). The plugin hands out whole replicas and enforces what it promises
itself (MPS: an equal share of memory and compute per replica), so the webhook sends the pod only to the
nodes whose allocatable names the resource, and counts it under that resource's own quota key. The
memory recorded for one is the figure its name states (`gpu-10gb`: 10240 MiB), else the card's
(`nvidia.com/gpu.memory`), divided by `nvidia.com/gpu.replicas` under MPS
(`nvidia.com/gpu.sharing-strategy=mps`), whose control daemon pins each client to that share.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.core.domain.model import Allocation, Gpu, Node, Snapshot, TopologyClass
from webhook.core.domain.request import PodRequest
from webhook.core.domain.vendor_quota import device_resource
from webhook.core.podspec.inventory import LevelMatrix, Matrix
from webhook.core.podspec.quantity import QuantityError, parse_quantity
from webhook.core.podspec.vendor_table import MIG_PREFIX, device_kind, mig_memory_of_name, mig_profile
from webhook.core.policy.model import Policy

from .nodeconstraints import AFFINITY, SELECTOR, TAINT
from .place import constraints_for

Offer = Mapping[str, tuple[int, int]]  # profile -> (devices, MiB of one)


def _whole(value: object) -> int | None:
    try:
        quantity = parse_quantity(value)
    except QuantityError:
        return None
    return int(quantity) if quantity.denominator == 1 and quantity >= 0 else None


def offer_of(labels: Mapping[str, str], allocatable: Mapping[str, Any],
             inventory: Iterable[tuple[str, int]] = ()) -> dict[str, tuple[int, int]]:
    """A node's MIG devices by profile from its allocatable, GFD labels and inventory (profile, MiB)
    pairs, and its other advertised NVIDIA resources by name. The allocatable count wins where it is
    given: it is what the device plugin advertises now (healthy devices only); the labels and the
    inventory count every device."""
    counts: dict[str, int] = {}
    memory: dict[str, int] = {}
    for profile, mib in inventory:
        counts[profile] = counts.get(profile, 0) + 1
        memory.setdefault(profile, mib)
    for key, value in labels.items():
        if not key.startswith(MIG_PREFIX):
            continue
        base, _, suffix = key.rpartition(".")
        profile = mig_profile(base)
        number = _whole(value)
        if not profile or number is None:
            continue
        if suffix == "count":
            counts[profile] = number
        elif suffix == "memory" and number > 0:
            memory[profile] = number
    for key, value in allocatable.items():
        kind = device_kind(key) if isinstance(key, str) else ""
        number = _whole(value)
        if kind and number is not None:
            counts[kind] = number
            if "/" in kind:  # an advertised resource: the figure its name states (`gpu-10gb`), else a replica's
                memory[kind] = mig_memory_of_name(kind.rpartition("/")[2]) or _replica_memory(labels)
    return {p: (n, memory.get(p) or mig_memory_of_name(p)) for p, n in sorted(counts.items()) if n > 0}


def _replica_memory(labels: Mapping[str, str]) -> int:
    """MiB one replica of the node's card may use: the card's (time-slicing shares all of it), an equal
    part of it under MPS; 0 when GFD states no memory."""
    card = _whole(labels.get("nvidia.com/gpu.memory")) or 0
    if labels.get("nvidia.com/gpu.sharing-strategy") != "mps":
        return card
    return card // max(1, _whole(labels.get("nvidia.com/gpu.replicas")) or 1)


def plan(request: PodRequest, snapshot: Snapshot, policy: Policy) -> tuple[tuple[str, ...], Allocation | str]:
    """The nodes the pod may go to (offering `request.gpus` devices of its profile, reachable by its
    nodeSelector, affinity and tolerations) and its allocation, or the 422 message when there are none.
    The node is left to the scheduler, which counts the kubelet's MIG devices itself."""
    profile, wanted, resource = request.mig, request.gpus, device_resource(request.mig)
    offering = [n for n in snapshot.nodes.values() if profile in n.mig]
    if not offering:
        have = sorted({device_resource(p) for n in snapshot.nodes.values() for p in n.mig})
        shown = f" (offered: {', '.join(have)})" if have else ""
        what = "a MIG profile" if "/" not in profile else "a resource"
        return (), f"no node offers {resource}{shown}; ask for {what} a node offers, or for nvidia.com/gpu"
    enough = [n for n in offering if n.mig[profile][0] >= wanted]
    if not enough:
        most = max(offering, key=lambda n: n.mig[profile][0])
        return (), (f"asks for {wanted} {resource} in one pod, but no node offers that many (at most "
                    f"{most.mig[profile][0]}, on {most.name}); ask for fewer, or spread them over pods")
    constraints = constraints_for(request, policy.tolerations)
    reasons: dict[str, int] = {}
    eligible: list[Node] = []
    for node in enough:
        why = constraints.refusal(node)
        if why:
            reasons[why] = reasons.get(why, 0) + 1
        else:
            eligible.append(node)
    if not eligible:
        where = " and ".join(constraints.describe(r) for r in (SELECTOR, AFFINITY, TAINT) if reasons.get(r))
        return (), (f"{len(enough)} node(s) offer {wanted} {resource}, but {where or 'a cordon'} keeps the pod "
                    "off all of them; change the pod's node constraints")
    memory = min(n.mig[profile][1] for n in eligible)  # the device the pod may get: the smallest figure
    models = {n.labels.get("nvidia.com/gpu.product") or n.gpu_model for n in eligible} - {""}
    if "/" in profile:  # an advertised resource: the product as GFD labels it (`Tesla-T4`)
        model, how = models.pop() if len(models) == 1 else resource, "advertised"
    else:
        model, how = f"{models.pop()}-MIG-{profile}" if len(models) == 1 else f"MIG-{profile}", "mig"
    topology = TopologyClass.SINGLE if wanted <= 1 else TopologyClass.PCIE
    allocation = Allocation(None, (), wanted, memory, 100, "nvidia", model, topology, 0.0, how, mig=profile)
    return tuple(sorted(n.name for n in eligible)), allocation


def whole_cards(gpus: tuple[Gpu, ...], nvlink: Matrix, pcie: LevelMatrix,
                mig_enabled: list[bool]) -> tuple[tuple[Gpu, ...], Matrix, LevelMatrix]:
    """The inventory's GPUs that are cards, not MIG-partitioned (the device plugin hands out a MIG-mode
    GPU only as its MIG devices), with the link matrices cut to them."""
    keep = [i for i in range(len(gpus)) if not (i < len(mig_enabled) and mig_enabled[i])]
    if len(keep) == len(gpus):
        return gpus, nvlink, pcie
    return (tuple(gpus[i] for i in keep), tuple(tuple(nvlink[i][j] for j in keep) for i in keep),
            tuple(tuple(pcie[i][j] for j in keep) for i in keep))


def node_offer(node: Node) -> list[str]:
    """The node's MIG and advertised resources as `<resource>: <count> x <MiB> MiB` lines (for reports)."""
    return [f"{device_resource(p)}: {n} x {m} MiB" for p, (n, m) in node.mig.items()]
