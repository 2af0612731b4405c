"""What a pod asks for, as the allocation core reads it: `PodRequest`, made once per admission by
`podspec.resources.parse_pod`, with a `ContainerRequest` (and its `GpuRequest`) per container.

Frozen values, like the rest of the domain (model.py: the cluster; placement and decisions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .podview import PodView
from .refusal import Refusal


class TopologyPreference(StrEnum):
    REQUIRED = "required"
    PREFERRED = "preferred"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """The GPU part of one container's resources, as written (None: not given)."""

    vendor: str
    count: int
    memory_mib: int | None = None
    memory_pct: int | None = None
    cores: int | None = None
    # MIG profile of an `nvidia.com/mig-<profile>` request ("3g.20gb"), or the name of another resource
    # NVIDIA's device plugin advertises ("nvidia.com/gpu.shared"); count is its devices
    mig: str = ""


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container or init container. `index` is its position in its list (for patch paths)."""

    name: str
    index: int
    init: bool = False
    gpu: GpuRequest | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    # Names of GPU resources this container carries in `resources` (limits and requests) that the
    # mutation moves into the annotation (gpumem, gpumem-percentage, gpucores and vendor equivalents).
    moved_resources: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodRequest:
    """A pod (or one pod of a workload template), reduced to what admission needs."""

    namespace: str
    name: str  # metadata.name, else generateName, else ""
    containers: tuple[ContainerRequest, ...] = ()
    uid: str = ""
    vendor: str = ""  # "" when the pod asks for no known GPU resource
    # Effective pod-level demand: GPUs on one node, per-GPU memory (MiB or % of the card) and cores.
    gpus: int = 0
    memory_mib: int | None = None
    memory_pct: int | None = None
    cores: int | None = None
    cpu_milli: int = 0  # effective (init containers counted as Kubernetes does)
    memory_mib_host: int = 0
    models_include: tuple[str, ...] = ()  # nvidia.com/use-gputype, case-insensitive substrings
    models_exclude: tuple[str, ...] = ()
    uuids_include: tuple[str, ...] = ()
    uuids_exclude: tuple[str, ...] = ()
    placement: str | None = None  # gpu-admission.io/placement, or HAMi's node-scheduler-policy
    gpu_placement: str | None = None  # HAMi's gpu-scheduler-policy (binpack/spread inside a node)
    topology: TopologyPreference | None = None
    scheduler_name: str = "default-scheduler"
    node_name: str = ""
    is_gpu_pod: bool = False
    dra_gpus: int = 0  # of `gpus`, those that come through DRA claims or DRA-backed extended resources
    # The MIG profile (or advertised resource, vendor_quota.device_resource) every GPU of the pod is
    # (`gpus` devices of it), "" for cards
    mig: str = ""
    violations: tuple[Refusal, ...] = ()
    warnings: tuple[str, ...] = ()
    # The pod as given (a dict, read-only by convention), for the mutation to compute paths against.
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # What placement derives from `raw` (its node constraints, by the tolerations added), kept with the
    # request: parsed before a server's plan lock, found parsed under it. Made on first use (a request
    # built by copying another's fields starts with none); copies share it while `raw` is the same.
    derived: dict[Any, Any] | None = field(default=None, init=False, compare=False, repr=False)
    # The pod read once (made by `podspec.podshape.read_pod` or `parse_pod`), for the rules to read
    # instead of `raw`; None when the request was made otherwise. Always a view of `raw`: a copy given
    # another raw pod drops it (`podspec.view.view_for` makes one when it is missing).
    view: PodView | None = field(default=None, compare=False, repr=False)

    def evolve(self, **changes: Any) -> PodRequest:
        """`dataclasses.replace` without re-running `__init__`, which checks nothing here: a request is
        copied on every admission, and replace() costs eight times more."""
        if not changes.keys() <= self.__dataclass_fields__.keys():
            unknown = changes.keys() - self.__dataclass_fields__.keys()
            raise TypeError(f"PodRequest has no field {', '.join(sorted(unknown))}")
        fields = self.__dict__.copy()
        fields.update(changes)
        if "raw" in changes:
            fields["derived"] = None
            if "view" not in changes and changes["raw"] is not self.raw:
                fields["view"] = None
        new = object.__new__(PodRequest)
        object.__setattr__(new, "__dict__", fields)
        return new

    @property
    def shared(self) -> bool:
        """True when the pod asks for a slice of a card rather than whole cards."""
        whole_memory = self.memory_mib is None and (self.memory_pct is None or self.memory_pct >= 100)
        whole_cores = self.cores is None or self.cores >= 100
        return not (whole_memory and whole_cores)
