"""How to place: the policy, its knobs and the workload mix, as every placement module reads them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from webhook.core.domain.model import DEFAULT_TOPOLOGY_LOSS, Node, NodeUsage, Option, TopologyClass
from webhook.core.domain.names import PLACEMENT_POLICIES
from webhook.core.domain.request import PodRequest

from .nodeconstraints import NodeConstraints, Toleration

POLICIES = PLACEMENT_POLICIES

# A custom scorer: (request, node, node usage, candidate option) -> score, higher is better.
Scorer = Callable[[PodRequest, Node, NodeUsage, Option], float]

DEFAULT_LOSS = DEFAULT_TOPOLOGY_LOSS

_T = TypeVar("_T")


class HashedTuple(tuple[_T, ...]):
    """A tuple whose hash is computed once: for values that key memos on a hot path (a learned mix, a
    mix's shares and chances), where hashing every member at each look-up would show."""

    def __hash__(self) -> int:
        found: int | None = self.__dict__.get("_hash")
        if found is None:
            found = self.__dict__["_hash"] = super().__hash__()
        return found


@dataclass(frozen=True)
class WorkloadShape:
    """One kind of pod in the workload mix: GPUs per pod and thousandths of a GPU each (1000 = whole)."""

    gpus: int
    milli: int
    weight: float = 1.0
    cpu_milli: int = 0
    memory_mib: int = 0
    models: tuple[str, ...] = ()


class CompiledMix:
    """The context's workload mix as the fragmentation measure takes it, filled by the scorer on first use."""

    __slots__ = ("mix",)

    def __init__(self) -> None:
        self.mix: Any = None


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
    allowed_models: tuple[str, ...] = ()  # the namespace's allowedModels (substrings); empty: any
    tolerations: tuple[Mapping[str, Any], ...] = ()  # the policy's, which the mutation adds to the pod
    # The constraints of pods that state none of their own, per vendor (one value per context).
    plain: dict[str, tuple[tuple[Toleration, ...], NodeConstraints]] = field(default_factory=dict, compare=False,
                                                                              repr=False)
    # The workload mix compiled for the fragmentation scorer, once per context (not an argument: a context
    # made by `dataclasses.replace`, say with a newly learned mix, compiles its own).
    compiled: CompiledMix = field(default_factory=lambda: CompiledMix(), init=False, compare=False, repr=False)
