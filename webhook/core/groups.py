"""Groups of pods that must share one topology domain (multi-pod jobs across nodes).

A group is the set of pods one controller makes for one job (PyTorchJob workers, a JobSet's replicated
job, a LeaderWorkerSet group, a Ray worker group, a Volcano job, a PodGroup) or that name it with
`gpu-admission.io/group`. The first pod of a group chooses the domain (a value of a topology level: a
node label such as `nvidia.com/gpu.clique`) that can hold the whole group; later pods follow it. The
choice lives in a `GroupRecord`, kept with the reservations so that replicas and restarts agree.

Interface shared by the core (admission), the cluster layer (ledger, snapshot) and `check`:
- `group_of(pod)` reads a pod's group from its labels and annotations;
- `Snapshot.groups` holds the records known when the snapshot was taken, by `GroupRecord.key`;
- a decision's `Allocation.group` / `Allocation.domain` name the group and the domain chosen;
- `commit(records, allocation, member)` is what the ledger (and `check`, between replicas) runs to
  record a member: it returns the updated record, or a refusal when the domain is no longer the group's
  to take (another group won it meanwhile).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GROUP_ANNOTATION = "gpu-admission.io/group"
GROUP_SIZE_ANNOTATION = "gpu-admission.io/group-size"
GROUP_TOPOLOGY_ANNOTATION = "gpu-admission.io/group-topology"


@dataclass(frozen=True, slots=True)
class GroupRef:
    """A pod's group as its labels/annotations state it."""

    namespace: str
    name: str  # stable within the namespace, e.g. "pytorchjob/train" or "jobset/js/workers"
    size: int | None  # pods in the group; None when open-ended
    source: str  # what named it: the label or annotation key

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """Where a group lives and how much of it is placed, as the ledger keeps it."""

    namespace: str
    name: str
    level: str  # node label key of the domain ("nvidia.com/gpu.clique")
    domain: str  # that label's value
    size: int | None  # pods expected (None: open-ended)
    gpus_per_pod: int
    members: tuple[str, ...] = ()  # admitted pods (UIDs in the webhook, names in `check`), sorted

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def promised_gpus(self) -> int:
        """GPUs of the domain the group still expects to take (beyond its members already placed)."""
        if self.size is None:
            return 0
        return max(self.size - len(self.members), 0) * self.gpus_per_pod


def group_of(pod: Mapping[str, Any], namespace: str) -> GroupRef | None:
    """The pod's group, or None when it belongs to none."""
    raise NotImplementedError


def record_to_json(record: GroupRecord) -> dict[str, Any]:
    raise NotImplementedError


def record_from_json(data: Any) -> GroupRecord:
    """Raises ValueError naming the field when `data` is not a record."""
    raise NotImplementedError


def commit(records: Mapping[str, GroupRecord], ref: GroupRef, level: str, domain: str, gpus_per_pod: int,
           member: str) -> GroupRecord | str:
    """The group's record with `member` added (created when the group has none), or a refusal message
    when the domain cannot be the group's: another group's record already promises what it needs."""
    raise NotImplementedError
