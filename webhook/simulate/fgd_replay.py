"""The `fgd` baseline: the trace replayed with the FGD paper's own scoring (webhook/core/placement/fgd.py).

Same arrivals, same measure and the same Run as the product's policies (replay.py), so the two are
compared in one run; only the choice of node and GPUs differs. The mix is the trace's task list, as
the paper's simulator takes it, not the arrivals of one seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from webhook.core.domain.model import Node
from webhook.core.placement.fgd import FgdCluster, Kind, Task, typical_kinds

from .replay import Run, drive
from .trace import TracePod

NAME = "fgd"
UNREPORTED = 1 << 40  # a node's CPU or memory of 0 means "not reported": it never constrains


def task_of(pod: TracePod) -> Task:
    return Task(pod.cpu_milli, pod.milli if pod.gpus else 0, pod.gpus, pod.models, pod.memory_mib)


def kinds_of(pods: Sequence[TracePod]) -> tuple[Kind, ...]:
    return typical_kinds(task_of(p) for p in pods)


def cluster_of(nodes: Sequence[Node], kinds: Sequence[Kind]) -> FgdCluster:
    return FgdCluster(((n.name, n.gpu_model, sum(1 for g in n.gpus if g.healthy), n.cpu_milli or UNREPORTED,
                        n.memory_mib or UNREPORTED) for n in nodes if not n.unschedulable), kinds)


def fgd_replay(
    nodes: Sequence[Node],
    arrivals: Sequence[TracePod],
    kinds: Sequence[Kind],
    seed: int,
    *,
    progress: Callable[[int], None] | None = None,
    progress_every: int = 256,
) -> Run:
    """Place `arrivals` one at a time with FGD; a pod that fits nowhere fails and is not retried. The seed
    drew the arrivals; FGD's choices draw nothing."""
    cluster = cluster_of(nodes, kinds)
    tasks: dict[int, Task] = {}

    def decide(_: int, pod: TracePod) -> bool | None:
        task = tasks.get(id(pod))
        if task is None:
            task = tasks[id(pod)] = task_of(pod)
        if cluster.place(task) is not None:
            return True
        return False if pod.gpus else None

    return drive(NAME, seed, nodes, arrivals, decide, progress, progress_every)
