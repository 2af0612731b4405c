"""The pod as the rules read it: `PodView`, with a `ContainerView` for each of its containers.

Values, like the rest of the domain: `podspec.view` builds them, once per admission (`podspec.podshape
.read_pod`), and a `PodRequest` keeps the view it was parsed from (`PodRequest.view`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")
NONE: tuple[Any, ...] = ()  # every absent list field
EMPTY: Mapping[str, Any] = MappingProxyType({})  # every absent mapping field: read-only


# Read-only by convention, not frozen: a frozen dataclass sets each field through object.__setattr__,
# which costs about seven times as much (benchmarks/value_objects.py).
@dataclass(slots=True)
class ContainerView:
    """One container of the pod: its kind ("containers", "initContainers", "ephemeralContainers"), its
    index in that list, the fields the rules read, the raw container and its JSON-patch path."""

    kind: str
    index: int
    name: str  # "" when it has none
    image: str
    restart_policy: str  # "Always" makes an init container a sidecar
    limits: Mapping[str, Any]
    requests: Mapping[str, Any]
    env: tuple[Mapping[str, Any], ...]
    env_from: tuple[Mapping[str, Any], ...]
    volume_mounts: tuple[Mapping[str, Any], ...]
    privileged: bool
    claims: tuple[Mapping[str, Any], ...]  # resources.claims: DRA claims the container uses
    raw: Mapping[str, Any]

    @property
    def path(self) -> str:
        """The container's JSON pointer, "/spec/containers/0"."""
        return f"/spec/{self.kind}/{self.index}"


@dataclass(slots=True)
class PodView:
    """The pod's fields the rules read. `containers` holds every container in the order the kubelet
    knows them (app, init, ephemeral); `app`, `init` and `ephemeral` are the same views by kind."""

    raw: Mapping[str, Any]  # the base of patch values only
    name: str  # metadata.name, else generateName, else ""
    namespace: str
    uid: str
    annotations: Mapping[str, Any]
    labels: Mapping[str, Any]
    containers: tuple[ContainerView, ...]
    volumes: tuple[Mapping[str, Any], ...]
    node_selector: Mapping[str, Any]
    affinity: Mapping[str, Any]
    tolerations: tuple[Mapping[str, Any], ...]
    node_name: str
    scheduler_name: str  # "" when the pod names none
    runtime_class_name: str
    resource_claims: tuple[Mapping[str, Any], ...]
    overhead: Mapping[str, Any]
    scheduling_gates: tuple[Mapping[str, Any], ...]

    @property
    def app(self) -> tuple[ContainerView, ...]:
        return tuple(c for c in self.containers if c.kind == "containers")

    @property
    def init(self) -> tuple[ContainerView, ...]:
        return tuple(c for c in self.containers if c.kind == "initContainers")

    @property
    def ephemeral(self) -> tuple[ContainerView, ...]:
        return tuple(c for c in self.containers if c.kind == "ephemeralContainers")

    def of_kind(self, *kinds: str) -> tuple[ContainerView, ...]:
        return tuple(c for c in self.containers if c.kind in kinds)

    def container(self, kind: str, index: int) -> ContainerView | None:
        """The container at `index` of the list `kind`, None when the list is shorter."""
        containers = self.containers
        if index < len(containers):  # app containers come first: one of them is where its index says
            found = containers[index]
            if found.index == index and found.kind == kind:
                return found
        return next((c for c in containers if c.index == index and c.kind == kind), None)


def absent(field: Mapping[str, Any]) -> bool:
    """True when a mapping field of a view was not in the pod (or not a mapping): a patch then adds the
    whole field, where it adds single keys to one that is there, even empty."""
    return field is EMPTY


__all__ = ["CONTAINER_KINDS", "EMPTY", "NONE", "ContainerView", "PodView", "absent"]
