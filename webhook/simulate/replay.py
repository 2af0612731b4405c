"""The FGD paper's procedure: shuffle, resample to `tune` x capacity, place one at a time, never depart.

Placement goes through `webhook.core.placement.place` exactly as the webhook calls it (place, commit, and the
index kept up to date in place), so what is measured here is what the cluster would do. The workload mix
is learned as in production: the histogram of the GPU pods arrived (placed, or pending after failing to
fit) is the one the watch cache keeps (`core.mixlearn.Histogram`), quantised by the same `mix_of` (kept up
to date pod by pod: `core.mixlearn.Learner`).
"""

from __future__ import annotations

import gc
import random
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from webhook.core.domain.model import GpuUsage, Node, NodeUsage
from webhook.core.domain.request import PodRequest
from webhook.core.placement.context import PlacementContext, WorkloadShape
from webhook.core.placement.fragmentation import forget
from webhook.core.placement.mixlearn import Learner, hosts_of, request_shape
from webhook.core.placement.nodeindex import NodeIndex
from webhook.core.placement.place import commit, place

from .trace import TracePod, to_request

DEFAULT_TUNE = 1.3
# The workload mix: learned from the pods as they arrive (production's), the neutral default, or fixed.
Mix = str | tuple[WorkloadShape, ...]
LEARN = "learn"


@dataclass(frozen=True)
class Run:
    """One policy on one seed: after each pod, the GPU thousandths arrived so far and allocated now."""

    policy: str
    seed: int
    capacity_milli: int
    arrived: array[int]
    allocated: array[int]
    failed: int  # GPU pods that fitted nowhere
    seconds: float
    unplaced_cpu_only: int = 0  # pods asking for no GPU that were not placed

    @property
    def pods(self) -> int:
        return len(self.arrived)

    def allocated_at(self, arrived_milli: float) -> float | None:
        """Allocated thousandths when the arrived request reached `arrived_milli` (linear in between pods)."""
        if arrived_milli <= 0:
            return 0.0
        i = bisect_left(self.arrived, arrived_milli)
        if i >= len(self.arrived):
            return None
        a1, u1 = self.arrived[i], self.allocated[i]
        if a1 == arrived_milli:
            return float(u1)
        a0, u0 = (self.arrived[i - 1], self.allocated[i - 1]) if i else (0, 0)
        return float(u0 + (u1 - u0) * (arrived_milli - a0) / (a1 - a0))

    def unallocated_pct(self, arrived_pct: float) -> float | None:
        """100 - allocated % of capacity, when the arrived request is `arrived_pct` % of capacity."""
        allocated = self.allocated_at(arrived_pct * self.capacity_milli / 100)
        return None if allocated is None else 100.0 - 100.0 * allocated / self.capacity_milli


def capacity_milli(nodes: Sequence[Node]) -> int:
    """The cluster's GPU capacity in thousandths of a card (healthy cards only)."""
    return 1000 * sum(1 for n in nodes for g in n.gpus if g.healthy)


def workload(pods: Sequence[TracePod], capacity: int, seed: int, tune: float = DEFAULT_TUNE) -> list[TracePod]:
    """The arrival order for one seed: the trace shuffled, then trimmed or topped up with random draws
    (with replacement) so that the total GPU request comes to `tune` x capacity without passing it."""
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    target = tune * capacity
    total = sum(p.gpu_milli for p in order)
    while total > target and order:
        total -= order.pop(rng.randrange(len(order))).gpu_milli
    if total < target and any(p.gpu_milli for p in pods):
        while True:
            extra = pods[rng.randrange(len(pods))]
            if total + extra.gpu_milli > target:
                break
            order.append(extra)
            total += extra.gpu_milli
    return order


def empty_usage(node: Node) -> NodeUsage:
    return NodeUsage(gpus=tuple(GpuUsage() for _ in node.gpus))


def overcommitted(node: Node, usage: NodeUsage) -> list[str]:
    """What is over-committed on the node (empty when nothing is): the simulator's invariant."""
    problems: list[str] = []
    if len(usage.gpus) != len(node.gpus):
        problems.append(f"{node.name}: usage has {len(usage.gpus)} GPUs, node {len(node.gpus)}")
    for gpu, used in zip(node.gpus, usage.gpus, strict=False):
        if used.cores > 100:
            problems.append(f"{node.name}: GPU {gpu.index}: cores {used.cores} > 100")
        if used.memory_mib > gpu.memory_mib:
            problems.append(f"{node.name}: GPU {gpu.index}: memory {used.memory_mib} > {gpu.memory_mib} MiB")
        if used.exclusive and used.tasks > 1:
            problems.append(f"{node.name}: GPU {gpu.index}: held exclusively by {used.tasks} tasks")
    if node.cpu_milli and usage.cpu_milli > node.cpu_milli:
        problems.append(f"{node.name}: cpu {usage.cpu_milli} > {node.cpu_milli} millicores")
    if node.memory_mib and usage.memory_mib > node.memory_mib:
        problems.append(f"{node.name}: memory {usage.memory_mib} > {node.memory_mib} MiB")
    return problems


class InvariantError(AssertionError):
    """A placement over-committed a node: a bug in the placement core, never bad input."""


def replay(
    nodes: Sequence[Node],
    arrivals: Sequence[TracePod],
    policy: str,
    seed: int,
    *,
    mix: Mix = LEARN,
    check: bool = False,
    progress: Callable[[int], None] | None = None,
    progress_every: int = 256,
) -> Run:
    """Place `arrivals` one at a time with `policy`; a pod that fits nowhere fails and is not retried.

    `mix`: "learn" (as the webhook does), "default" (`default_mix()`), or a fixed mix."""
    forget()  # the last replay's node states: another cluster's, never looked up again
    by_name: Mapping[str, Node] = {n.name: n for n in nodes}
    index = NodeIndex.build(by_name, {n.name: empty_usage(n) for n in nodes})
    learn = mix == LEARN
    fixed = mix if isinstance(mix, tuple) else ()
    ctx = PlacementContext(policy=policy, limit=1, seed=seed, workload_mix=fixed)
    requests: dict[int, PodRequest] = {}
    observed = Learner(hosts_of(nodes) if learn else ())

    def decide(i: int, pod: TracePod) -> bool | None:
        nonlocal ctx
        request = requests.get(id(pod))
        if request is None:
            request = requests[id(pod)] = to_request(pod)
        if learn and request.gpus and observed.add(request_shape(request)):
            learned = observed.mix()  # `mix_of`: what the webhook learns from the same pods
            if learned is not ctx.workload_mix:
                ctx = replace(ctx, workload_mix=learned)
        best = place(request, index, ctx).best
        if best is None:
            return False if request.gpus else None
        node = by_name[best.node]
        after = commit(index.usage(best.node), best, request, node)
        if check and (problems := overcommitted(node, after)):
            raise InvariantError(f"pod {pod.name} ({i}): " + "; ".join(problems))
        index.apply(best.node, after)
        return True

    return drive(policy, seed, nodes, arrivals, decide, progress, progress_every)


def drive(
    policy: str,
    seed: int,
    nodes: Sequence[Node],
    arrivals: Sequence[TracePod],
    decide: Callable[[int, TracePod], bool | None],
    progress: Callable[[int], None] | None = None,
    progress_every: int = 256,
) -> Run:
    """The replay loop every policy shares: `decide(i, pod)` places one pod (True), or fails a GPU pod
    (False) or a pod asking for no GPU (None); the curves and counts are kept here."""
    arrived_log: array[int] = array("q")
    allocated_log: array[int] = array("q")
    arrived = allocated = failed = unplaced_cpu_only = 0
    started = time.perf_counter()
    # The placement memos hold a few hundred thousand objects that live for the whole run: the cyclic
    # collector would scan them again and again (a third of the run's time). It is off for the run and
    # the caller chooses when to collect (a worker process exits instead; a seed peaks at about 250 MB).
    collecting = gc.isenabled()
    gc.disable()
    try:
        for i, pod in enumerate(arrivals, 1):
            arrived += pod.gpu_milli
            placed = decide(i, pod)
            if placed:
                allocated += pod.gpu_milli
            elif placed is None:
                unplaced_cpu_only += 1
            else:
                failed += 1
            arrived_log.append(arrived)
            allocated_log.append(allocated)
            if progress is not None and i % progress_every == 0:
                progress(progress_every)
    finally:
        if collecting:
            gc.enable()
    if progress is not None and len(arrivals) % progress_every:
        progress(len(arrivals) % progress_every)
    return Run(
        policy=policy,
        seed=seed,
        capacity_milli=capacity_milli(nodes),
        arrived=arrived_log,
        allocated=allocated_log,
        failed=failed,
        seconds=time.perf_counter() - started,
        unplaced_cpu_only=unplaced_cpu_only,
    )
