"""FGD as its authors published it: the baseline the simulator measures the product's policy against.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent", USENIX ATC 2023, as implemented in their simulator (hkust-adsl/kubernetes-scheduler-simulator:
`utils.NodeGpuShareFragAmount`, `utils.GetTypicalPods`, `plugin.FGDScorePlugin`), reproduced here step
by step and nothing added:

- The workload mix ("typical pods") is the trace's own task list: one kind per distinct (CPU, thousandths
  of a GPU, GPU count, GPU models), most frequent first, kept until they cover 95 % of the tasks (one at a
  time), their frequencies renormalised. Tasks asking for no GPU are kinds too.
- A node's fragmentation for one kind of task (in thousandths of a GPU): when the kind asks for no GPU,
  or for GPU models the node has not, or the node lacks the GPUs or the CPU it needs, all of the node's
  free GPU capacity; otherwise the free capacity of the GPUs with less room than the kind's share (the
  "Q3 satisfied" case). The node's fragmentation is the expectation over the mix.
- A pod's score on a node is int(100 x sigmoid((before - after) / 1000)), the growth of fragmentation
  squashed into the scheduler's 0..100 integer range; a pod sharing one GPU tries each GPU that fits and
  keeps the best (the first on ties), whole-card pods take the fullest GPUs that fit (`NodeResource.Sub`).
  The node with the highest score wins; of equal ones the first by name (the reference's scheduler breaks
  ties so, "for reproducibility", where the upstream scheduler draws one at random).
- Nodes' CPU and memory, GPU room and GPU models filter, as the scheduler's filters do. GPU memory is not
  modelled: a task asks for a share of a card.

Pure: no I/O, nothing random.
"""

from __future__ import annotations

import math
from bisect import insort
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MILLI = 1000
POPULARITY = 95.0  # percent of the tasks the typical kinds cover (the paper's experiments)
MAX_SCORE = 100  # the scheduler framework's MaxNodeScore


@dataclass(frozen=True, slots=True)
class Task:
    """A pod as FGD sees it: CPU millicores, thousandths of a GPU per GPU, GPU count, accepted models."""

    cpu_milli: int
    milli: int  # 0: no GPU
    gpus: int
    models: tuple[str, ...] = ()  # empty: any model
    memory_mib: int = 0  # filters only; not part of a kind


@dataclass(frozen=True, slots=True)
class Kind:
    """One typical pod: its demand and its frequency in the mix (the frequencies sum to 1)."""

    cpu_milli: int
    milli: int
    gpus: int
    models: tuple[str, ...]
    weight: float


def typical_kinds(tasks: Iterable[Task], popularity: float = POPULARITY) -> tuple[Kind, ...]:
    """The mix: the most frequent kinds covering `popularity` % of the tasks, renormalised.

    Ordered as the reference sorts them: by count, then by CPU, share, GPU count and models, all
    descending (`sort.Reverse` of its ascending order); the cut is taken one kind at a time."""
    counts = Counter((t.cpu_milli, t.milli, t.gpus, "|".join(t.models)) for t in tasks)
    total = sum(counts.values())
    if not total:
        return ()
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    wanted = popularity * total / 100
    kept: list[tuple[tuple[int, int, int, str], int]] = []
    covered = 0
    for key, count in ranked:
        if covered >= wanted:
            break
        kept.append((key, count))
        covered += count
    return tuple(Kind(cpu, milli, gpus, tuple(m for m in models.split("|") if m), count / covered)
                 for (cpu, milli, gpus, models), count in kept)


def accessible(model: str, models: tuple[str, ...]) -> bool:
    """The reference's GPU type match: exact names; a pod naming none takes any GPU node."""
    return not models or (bool(model) and model in models)


def fragmentation(model: str, free: Sequence[int], cpu_left: int, kinds: Sequence[Kind]) -> float:
    """The node's expected fragmentation, thousandths of a GPU (`NodeGpuShareFragAmountScore`).

    `free`: thousandths free on each GPU of the node; `cpu_left`: millicores free."""
    total = sum(free)
    if total == 0:
        return 0.0
    value = 0.0
    for kind in kinds:
        if kind.milli == 0 or not accessible(model, kind.models):
            value += kind.weight * total  # "xl"/"xr" and "no access": every free GPU counts
            continue
        fitting = sum(1 for f in free if f >= kind.milli)
        if fitting >= kind.gpus and cpu_left >= kind.cpu_milli:  # Q3: only the too-full GPUs count
            value += kind.weight * sum(f for f in free if f < kind.milli)
        else:  # Q1, Q2, Q4: lacks GPU room, CPU or both
            value += kind.weight * total
    return value


def score(before: float, after: float) -> int:
    """The plugin's score: int64(sigmoid((before - after) / 1000) * MaxNodeScore)."""
    x = (before - after) / MILLI
    return int(MAX_SCORE / (1.0 + math.exp(-x)))


def packed(free: tuple[int, ...], milli: int, gpus: int) -> tuple[int, ...] | None:
    """`NodeResource.Sub`: take `milli` from each of the `gpus` fullest GPUs with room; None if too few."""
    order = sorted(range(len(free)), key=lambda i: free[i])  # stable, as sort.SliceStable
    left = list(free)
    need = gpus
    for i in order:
        if need <= 0:
            break
        if free[i] >= milli:
            left[i] -= milli
            need -= 1
    return tuple(left) if need <= 0 else None


@dataclass(eq=False)
class _Class:
    """Nodes in one state (model, free GPU thousandths, free CPU, free memory); `best` memoises by task."""

    model: str
    free: tuple[int, ...]
    cpu: int
    memory: int
    names: list[str] = field(default_factory=list)  # sorted
    best: dict[int, tuple[int, tuple[int, ...]] | None] = field(default_factory=dict)  # by task number


class FgdCluster:
    """Nodes placed on by FGD, one pod at a time, never departing. Equivalent nodes are scored once."""

    def __init__(self, nodes: Iterable[tuple[str, str, int, int, int]], kinds: Sequence[Kind]) -> None:
        """`nodes`: (name, GPU model, healthy GPUs, CPU millicores, memory MiB)."""
        self.kinds = tuple(kinds)
        self.classes: dict[tuple[str, tuple[int, ...], int, int], _Class] = {}
        self.where: dict[str, _Class] = {}
        self._frag: dict[tuple[str, tuple[int, ...], int], float] = {}
        self._numbers: dict[Task, int] = {}  # a number per distinct task: cheaper memo keys than the task
        for name, model, gpus, cpu, memory in nodes:
            self._put(name, model, (MILLI,) * gpus, cpu, memory)

    def _put(self, name: str, model: str, free: tuple[int, ...], cpu: int, memory: int) -> None:
        key = (model, free, cpu, memory)
        found = self.classes.get(key)
        if found is None:
            found = self.classes[key] = _Class(model, free, cpu, memory)
        insort(found.names, name)
        self.where[name] = found

    def node_fragmentation(self, model: str, free: tuple[int, ...], cpu: int) -> float:
        key = (model, tuple(sorted(free)), cpu)  # the measure depends on the GPUs' free capacity, not their order
        value = self._frag.get(key)
        if value is None:
            if len(self._frag) >= 1 << 20:
                self._frag.clear()
            value = self._frag[key] = fragmentation(model, free, cpu, self.kinds)
        return value

    def _evaluate(self, group: _Class, task: Task) -> tuple[int, tuple[int, ...]] | None:
        """(score, free GPUs after) of the task on a node of the class, or None when it cannot go there."""
        if group.cpu < task.cpu_milli or group.memory < task.memory_mib:
            return None
        if task.gpus and not accessible(group.model, task.models):
            return None
        before = self.node_fragmentation(group.model, group.free, group.cpu)
        cpu = group.cpu - task.cpu_milli
        if task.gpus == 1 and task.milli < MILLI:  # a share of one GPU: try each GPU, keep the first best
            best: tuple[int, tuple[int, ...]] | None = None
            for i, f in enumerate(group.free):
                if f >= task.milli:
                    after = group.free[:i] + (f - task.milli,) + group.free[i + 1:]
                    value = score(before, self.node_fragmentation(group.model, after, cpu))
                    if best is None or value > best[0]:
                        best = (value, after)
            return best
        after_free = packed(group.free, task.milli, task.gpus) if task.gpus else group.free
        if after_free is None:
            return None
        return score(before, self.node_fragmentation(group.model, after_free, cpu)), after_free

    def place(self, task: Task) -> str | None:
        """Put the task on the best node (of equal ones, the first by name); its name, or None when none
        can host it."""
        best: tuple[int, str, _Class, tuple[int, ...]] | None = None
        number = self._numbers.setdefault(task, len(self._numbers))
        for group in self.classes.values():
            memo = group.best
            if number in memo:
                found = memo[number]
            else:
                found = memo[number] = self._evaluate(group, task)
            if found is None:
                continue
            if best is None or found[0] > best[0] or (found[0] == best[0] and group.names[0] < best[1]):
                best = (found[0], group.names[0], group, found[1])
        if best is None:
            return None
        _, name, group, after = best
        group.names.pop(0)
        if not group.names:
            del self.classes[(group.model, group.free, group.cpu, group.memory)]
        self._put(name, group.model, after, group.cpu - task.cpu_milli, group.memory - task.memory_mib)
        return name
