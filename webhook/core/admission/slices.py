"""A GPU slice as HAMi fills it in, and each container's own slice on the card placement chose.

HAMi resolves every container on its own (pkg/device/nvidia/device.go: GenerateResourceRequests,
defaultExclusiveCoreIfNeeded): no memory given means the whole card's memory; no cores given means the
whole card, exclusive, when the memory is the whole card, else no compute cap. Placement reserves the
pod's largest slice on each of its GPUs; the limits and the quota follow each container's own slice.
"""

from __future__ import annotations

from dataclasses import replace

from webhook.core.domain.model import Allocation
from webhook.core.domain.request import PodRequest
from webhook.core.policy.model import Policy

Slice = tuple[int | None, int | None, int | None]  # memory MiB, memory %, cores %


def fill(memory_mib: int | None, memory_pct: int | None, cores: int | None, policy: Policy) -> Slice:
    """The figures a slice leaves out, by HAMi's defaults or the policy's (memoryPercent, coresPercent,
    sliceDefaults). Depends on the request and the policy only, never on the rest of the cluster. With
    sliceDefaults "proportional", cores left None beside a MiB figure are resolved on the chosen card."""
    proportional = policy.slice_defaults == "proportional"
    if memory_mib is None and memory_pct is None:
        if cores is not None and policy.memory_percent:
            memory_pct = policy.memory_percent
        else:
            memory_pct = cores if proportional and cores is not None and cores > 0 else 100
    if cores is None:
        if memory_mib is None and memory_pct is not None and memory_pct >= 100:
            cores = 100  # the whole card: exclusive, as HAMi adds gpucores: 100
        elif policy.cores_percent is not None:
            cores = policy.cores_percent
        elif proportional:
            cores = memory_pct  # a percentage: that share; MiB: None, resolved on the chosen card
        else:
            cores = 0  # HAMi's defaultCores: best effort, no compute cap
    return memory_mib, memory_pct, cores


def pod_slice(request: PodRequest, policy: Policy) -> Slice:
    """What placement reserves on each of the pod's GPUs: the filled slice of a one-container pod, else
    the largest of each figure over the containers' filled slices (MiB and % both kept when containers
    gave different forms: placement takes the larger on each card)."""
    whole = request.memory_mib is None and request.memory_pct is None and request.cores is None
    gpus = [c.gpu for c in request.containers if c.gpu is not None and c.gpu.count > 0] if not whole else []
    if len(gpus) <= 1:
        return fill(request.memory_mib, request.memory_pct, request.cores, policy)  # one slice, or whole cards
    filled = [fill(g.memory_mib, g.memory_pct, g.cores, policy) for g in gpus]
    memory_mib = max((f[0] for f in filled if f[0] is not None), default=None)
    memory_pct = max((f[1] for f in filled if f[1] is not None), default=None)
    cores = max((f[2] for f in filled if f[2] is not None), default=None)
    return memory_mib, memory_pct, cores


def on_card(given: Slice, card: int) -> tuple[int, int]:
    """A filled slice in MiB and percent on a card of `card` MiB."""
    memory_mib, memory_pct, cores = given
    memory = memory_mib if memory_mib is not None else card * (memory_pct if memory_pct is not None else 100) // 100
    if cores is None:
        cores = min(100, max(1, -(-memory * 100 // card))) if card > 0 else 100
    return memory, cores


def per_container(request: PodRequest, allocation: Allocation, card: int, policy: Policy) -> Allocation:
    """The allocation with each GPU container's own slice recorded, when they are not all the pod's.
    A container asking for whole cards on cards the pod holds whole gets the card."""
    if card <= 0 or len(request.containers) == 1:
        return allocation  # one container: its slice is the pod's (the usual pod)
    own: list[tuple[str, bool, int, int, int]] = []
    differ = False
    for c in request.containers:
        g = c.gpu
        if g is None or g.count <= 0:
            continue
        memory, cores = on_card(fill(g.memory_mib, g.memory_pct, g.cores, policy), card)
        # Never above what placement reserved on each GPU (the pod's largest slice).
        memory, cores = min(memory, allocation.memory_mib), min(cores, allocation.cores)
        differ = differ or (memory, cores) != (allocation.memory_mib, allocation.cores)
        own.append((c.name, c.init, g.count, memory, cores))
    if not differ:
        return allocation
    return replace(allocation, containers=tuple(own))  # host resources, group and domain kept
