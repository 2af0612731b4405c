"""Node and GPU choice. INTERFACE STUB: the signatures below are the contract other modules code against.

Policies: random, best-fit, dot-product, binpack, spread, fewest-tasks, fragmentation, custom scorers
(registered by name in `PlacementContext.scorers`), and weighted combinations ({"binpack": 1, "fragmentation": 2}).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from .model import Node, NodeUsage, Option, Placement, PodRequest, Snapshot, TopologyClass

# A custom scorer: (request, node, node usage, candidate option) -> score, higher is better.
Scorer = Callable[[PodRequest, Node, NodeUsage, Option], float]

DEFAULT_LOSS: Mapping[TopologyClass, float] = {
    TopologyClass.SINGLE: 0.0,
    TopologyClass.NVLINK: 0.03,
    TopologyClass.MIXED: 0.20,
    TopologyClass.PCIE: 0.375,
}


@dataclass(frozen=True)
class WorkloadShape:
    """One kind of pod in the workload mix: GPUs per pod and thousandths of a GPU each (1000 = whole)."""

    gpus: int
    milli: int
    weight: float = 1.0
    cpu_milli: int = 0
    memory_mib: int = 0
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlacementContext:
    """How to place: the policy and its knobs. Built by admit from the policy file and the pod."""

    policy: str | Mapping[str, float] = "binpack"  # a name, or weights over names
    gpu_policy: str = "binpack"  # inside a node, for shared requests: binpack | spread
    topology_loss: Mapping[TopologyClass, float] = field(default_factory=lambda: dict(DEFAULT_LOSS))
    limit: int = 5  # how many options to return
    workload_mix: tuple[WorkloadShape, ...] = ()  # empty: the policy learns or assumes a default
    scorers: Mapping[str, Scorer] = field(default_factory=dict)
    seed: int = 0  # for the random policy


class NodeIndex:
    """Nodes grouped so that placement is sublinear in cluster size.

    `build` once from a snapshot; `updated` returns a new index sharing structure (copy-on-write,
    for the webhook's snapshots); `apply` changes this index in place (for the simulator).
    """

    @classmethod
    def build(cls, nodes: Mapping[str, Node], usage: Mapping[str, NodeUsage]) -> NodeIndex:
        raise NotImplementedError

    def updated(self, changes: Mapping[str, NodeUsage]) -> NodeIndex:
        raise NotImplementedError

    def apply(self, node: str, usage: NodeUsage) -> None:
        raise NotImplementedError

    def usage(self, node: str) -> NodeUsage:
        raise NotImplementedError


def index_of(snapshot: Snapshot) -> NodeIndex:
    """The snapshot's index (built and cached on first use)."""
    raise NotImplementedError


def place(request: PodRequest, index: NodeIndex, ctx: PlacementContext) -> Placement:
    """Eligible nodes, and the best options now, for a GPU pod."""
    raise NotImplementedError


def commit(usage: NodeUsage, option: Option, request: PodRequest, node: Node) -> NodeUsage:
    """The node's usage after hosting `request` as `option` says."""
    raise NotImplementedError
