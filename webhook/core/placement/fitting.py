"""Whether a pod fits a node, and on which of its GPUs: the filters of placement.

Split in two so that each half is computed once per class of equivalent nodes: the static verdict
(model, card memory, capacity, topology: could the node EVER host the pod) per node shape, and the
dynamic one (what is free now, which GPUs to take) per (shape, usage) state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.core.domain.model import TopologyClass
from webhook.core.domain.request import PodRequest, TopologyPreference
from webhook.core.podspec.dialects import MUTEX

from .nodeindex import LEVELS, MEMO_LIMIT, Shape, State, remember, share_level
from .topology import GpuSet, mask_of

# Entries per memo (a shape's verdicts, a node state's choices and scores) before it is dropped whole. A
# decision adds about five to each class it scores, and a long-lived state (idle nodes) sees every kind
# of pod: at 256 such memos were dropped every fifty or so kinds, a third of a trace replay's time.


@dataclass(slots=True)
class Demand:
    """A pod's GPU demand reduced to what filtering reads; `key` identifies it for memoisation.
    Never modified, but not frozen: one is made per admission and read in placement's inner loops,
    and a frozen dataclass costs three times as much to make (a named tuple, slower to read)."""

    vendor: str
    count: int
    memory_mib: int | None
    memory_pct: int | None
    cores: int | None
    exclusive: bool  # whole cards: needs idle GPUs and holds them alone
    cpu: int
    host_memory: int
    include: tuple[str, ...]  # lower-cased model substrings
    exclude: tuple[str, ...]
    required: bool  # topology: required
    topology_aware: bool  # topology: required or preferred
    gpu_policy: str | None  # the pod's own choice inside a node (binpack | spread)
    uuids_include: tuple[str, ...]
    uuids_exclude: tuple[str, ...]
    key: tuple[Any, ...]
    allowed_models: tuple[str, ...] = ()  # the namespace's allowedModels, lower-cased substrings
    cordon_ok: bool = False  # tolerates node.kubernetes.io/unschedulable: cordoned nodes may host it


def _lowered(models: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(m.strip().lower() for m in models if m.strip()) if models else ()


def demand_of(request: PodRequest, allowed_models: tuple[str, ...] = (), cordon_ok: bool = False) -> Demand:
    include = _lowered(request.models_include)
    exclude = _lowered(request.models_exclude)
    allowed = _lowered(allowed_models)
    required = request.topology is TopologyPreference.REQUIRED
    aware = request.topology is not TopologyPreference.NONE
    exclusive = not request.shared
    key = (
        request.vendor, request.gpus, request.memory_mib, request.memory_pct, request.cores, exclusive,
        request.cpu_milli, request.memory_mib_host, include, exclude, required, aware, allowed, cordon_ok,
    )  # fmt: skip
    return Demand(
        request.vendor, request.gpus, request.memory_mib, request.memory_pct, request.cores, exclusive,
        request.cpu_milli, request.memory_mib_host, include, exclude, required, aware, request.gpu_placement,
        request.uuids_include, request.uuids_exclude, key, allowed, cordon_ok,
    )  # fmt: skip


def per_gpu(demand: Demand, card: int) -> tuple[int, int]:
    """Memory (MiB) and cores (%) the pod takes on a card of `card` MiB.

    Whole cards take everything; a missing memory or cores figure takes the same share as the other.
    """
    if demand.exclusive:
        return card, 100
    if demand.memory_mib is not None:
        # Both only for a pod of several containers (one gave MiB, another a percentage): the larger.
        memory = max(demand.memory_mib, card * demand.memory_pct // 100 if demand.memory_pct else 0)
    elif demand.memory_pct is not None:
        memory = card * demand.memory_pct // 100
    elif demand.cores is not None:
        memory = card * demand.cores // 100
    else:
        memory = card
    if demand.cores is not None:
        cores = demand.cores
    elif demand.memory_pct is not None:
        cores = demand.memory_pct
    elif card > 0:
        cores = min(100, max(1, -(-memory * 100 // card)))
    else:
        cores = 100
    return memory, cores


@dataclass(frozen=True, slots=True)
class Fit:
    """A shape that could host the pod: the GPUs it may use and what it takes on each."""

    allowed: int  # bitmask: healthy GPUs of an allowed model whose card is large enough
    memory: tuple[int, ...]  # per GPU of the node
    cores: tuple[int, ...]
    first_bucket: int  # the index buckets before this one cannot hold the pod (see nodeindex.LEVELS)


def static_verdict(shape: Shape, demand: Demand) -> Fit | str:
    """Whether nodes of this shape could host the pod on an empty cluster; else the reason."""
    memo = shape.verdicts
    found = memo.get(demand.key)
    if found is None:
        if len(memo) >= MEMO_LIMIT:
            memo.clear()
        found = memo[demand.key] = _static(shape, demand)
    return found


def _static(shape: Shape, demand: Demand) -> Fit | str:
    node = shape.template
    if demand.vendor and node.vendor != demand.vendor:
        return "vendor"
    if node.unschedulable and not demand.cordon_ok:
        return "unschedulable"
    if len(node.gpus) < demand.count:
        return "gpu-count"
    allowed = 0
    for i, gpu in enumerate(node.gpus):
        model = gpu.model.lower()
        if demand.include and not any(m in model for m in demand.include):
            continue
        if any(m in model for m in demand.exclude):
            continue
        if demand.allowed_models and not any(m in model for m in demand.allowed_models):
            continue
        allowed |= 1 << i
    if allowed.bit_count() < demand.count:
        return "model"
    allowed &= shape.healthy
    if allowed.bit_count() < demand.count:
        return "unhealthy"
    needs = [per_gpu(demand, gpu.memory_mib) for gpu in node.gpus]
    if any(not 0 <= cores <= 100 for _, cores in needs):
        return "cores"
    sliced = not demand.exclusive and needs and any(cores < 100 for _, cores in needs)
    for i, gpu in enumerate(node.gpus):
        # A slice of a card whose memory is unknown could not be bounded: HAMi-core would run it unlimited.
        if needs[i][0] > gpu.memory_mib or (sliced and gpu.memory_mib == 0):
            allowed &= ~(1 << i)
    if allowed.bit_count() < demand.count:
        return "memory"
    if 0 < node.cpu_milli < demand.cpu:
        return "cpu"
    if 0 < node.memory_mib < demand.host_memory:
        return "host-memory"
    if demand.required and not shape.graph.could_nvlink(allowed, demand.count):
        return "topology"
    if demand.exclusive:
        first = LEVELS + demand.count
    else:
        first = min(
            share_level(needs[i][0], gpu.memory_mib, needs[i][1]) for i, gpu in enumerate(node.gpus) if allowed >> i & 1
        )
    return Fit(allowed, tuple(m for m, _ in needs), tuple(c for _, c in needs), first)


@dataclass(frozen=True, slots=True)
class Choice:
    """The GPUs a node would give the pod now. `alternatives`: one per distinct GPU state (shared pods)."""

    gpus: tuple[int, ...]
    memory: int  # per GPU
    cores: int
    topology: TopologyClass
    alternatives: tuple[Choice, ...] = ()


def choose_gpus(state: State, fit: Fit, allowed: int, demand: Demand, policy: str, token: int) -> Choice | str:
    """The GPUs to take on a node in this state, or why it cannot host the pod now.

    `policy` is the GPU policy inside the node; `token` stands for the demand (see Statics.token).
    """
    key = (token, allowed, policy)
    memo = state.memo
    found = memo.choices.get(key)
    if found is None:
        node = state.shape.template
        if node.cpu_milli > 0 and state.free_cpu < demand.cpu:
            found = "cpu"
        elif node.memory_mib > 0 and state.free_memory < demand.host_memory:
            found = "host-memory"
        else:
            # The GPUs do not depend on the pod's CPU and memory (`key`'s 7th and 8th): pods of other CPU
            # and memory share them.
            gpus = (demand.key[:6], demand.key[8:], allowed, policy)
            found = memo.gpus.get(gpus)
            if found is None:
                found = remember(memo.gpus, gpus, _choose(state, fit, allowed, demand, policy))
        remember(memo.choices, key, found)
    return found


def _choose(state: State, fit: Fit, allowed: int, demand: Demand, policy: str) -> Choice | str:
    """The GPUs (or why none), once the node has the CPU and memory for the pod."""
    node = state.shape.template
    graph = state.shape.graph
    if node.gpu_units is not None and sum(u.tasks for u in state.usage.gpus) + demand.count > node.gpu_units:
        return "busy"  # the scheduler counts whole units: a shared card still takes one per pod
    if demand.exclusive:
        free = allowed & state.idle
        if free.bit_count() < demand.count:
            return "busy"
        if demand.count == 1 or demand.topology_aware:
            found = graph.best_set(free, demand.count, state.idle)
        else:
            found = graph.describe(_lowest(free, demand.count))
        return _linked(found, fit, demand)
    usage = state.usage.gpus
    fitting: list[tuple[float, int]] = []
    spread, mutex = policy.startswith("spread"), policy.endswith(MUTEX)  # HAMi's gpu-scheduler-policy
    for i, gpu in enumerate(node.gpus):
        if not allowed >> i & 1:
            continue
        u = usage[i]
        if u.exclusive or gpu.memory_mib - u.memory_mib < fit.memory[i] or u.cores + fit.cores[i] > 100:
            continue
        if (mutex and u.tasks > 0) or (fit.cores[i] == 0 and u.cores >= 100):
            continue  # mutex: unused GPUs only; no best-effort task on a card whose compute is all promised
        used = max(u.memory_mib / gpu.memory_mib if gpu.memory_mib else 0.0, u.cores / 100)
        fitting.append((used if spread else -used, i))
    if len(fitting) < demand.count:
        return "busy"
    fitting.sort()
    if demand.count > 1:
        if demand.topology_aware:
            found = graph.best_set(mask_of([i for _, i in fitting]), demand.count, state.idle)
        else:
            found = graph.describe(tuple(sorted(i for _, i in fitting[: demand.count])))
        return _linked(found, fit, demand)
    best = fitting[0][0]
    tied = mask_of([i for rank, i in fitting if rank == best])
    found = graph.best_set(tied, 1, state.idle)
    assert found is not None
    seen = {usage[found.gpus[0]]}
    alternatives = [_choice(found, fit)]
    for _, i in fitting:
        if usage[i] not in seen:
            seen.add(usage[i])
            alternatives.append(_choice(graph.describe((i,)), fit))
    first = alternatives[0]
    return Choice(first.gpus, first.memory, first.cores, first.topology, tuple(alternatives))


def _lowest(mask: int, k: int) -> tuple[int, ...]:
    out: list[int] = []
    i = 0
    while len(out) < k:
        if mask >> i & 1:
            out.append(i)
        i += 1
    return tuple(out)


def _linked(found: GpuSet | None, fit: Fit, demand: Demand) -> Choice | str:
    """The choice, unless the pod requires all-NVLink and the best free set is not (GPUs busy now)."""
    assert found is not None
    if demand.required and found.topology not in (TopologyClass.NVLINK, TopologyClass.SINGLE):
        return "busy"
    return _choice(found, fit)


def _choice(found: GpuSet, fit: Fit) -> Choice:
    first = found.gpus[0]
    return Choice(found.gpus, fit.memory[first], fit.cores[first], found.topology)
