"""A pod read once into typed fields: `PodView`, with a `ContainerView` for each of its containers.

`view_of` runs once per admission, after `podshape.shape_error` has found every field the webhook
reads of the right type, and `parse_pod` keeps the view with the request (`PodRequest.view`); the
rules then read its fields instead of walking the pod's mappings again. Made without the shape check
(a pod from the watch cache, a request made by hand) a field of the wrong type reads as absent, as
`coerce.py` reads it, so building a view never raises.

The raw pod stays in the view for the JSON-patch paths only (`ContainerView.path` names a container).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from webhook.core.domain.model import PodRequest

from .coerce import mapping_of

CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")
_NONE: tuple[Any, ...] = ()
_EMPTY: Mapping[str, Any] = MappingProxyType({})  # shared by every absent mapping field: read-only


# Read-only by convention, not frozen: a frozen dataclass sets each field through object.__setattr__,
# which made building the view cost more (about 5 us a pod) than the walks it saves.
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
    raw: Mapping[str, Any]
    path: str  # "/spec/containers/0"


@dataclass(slots=True)
class PodView:
    """The pod's fields the rules read. `containers` holds every container in the order the kubelet
    knows them (app, init, ephemeral); `app`, `init` and `ephemeral` are the same views by kind."""

    raw: Mapping[str, Any]  # for patch paths only
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
        return next((c for c in self.containers if c.index == index and c.kind == kind), None)


def _text(value: object) -> str:
    if type(value) is str:
        return value
    return value if isinstance(value, str) else ""


def _map(value: Any) -> Mapping[str, Any]:
    """A mapping field, or one shared empty mapping (never written) when absent or of another type."""
    if type(value) is dict:
        return value
    return value if value is not None and isinstance(value, Mapping) else _EMPTY


def _entries(value: object) -> tuple[Mapping[str, Any], ...]:
    """A list of mappings as a tuple; an entry of another type is left out (the shape check refuses it)."""
    if not value or not isinstance(value, list):
        return _NONE
    entries = tuple(value)
    for entry in entries:
        if type(entry) is not dict:
            return tuple(e for e in entries if isinstance(e, Mapping))
    return entries


def _container(kind: str, index: int, raw: Mapping[str, Any]) -> ContainerView:
    get = raw.get
    resources = get("resources")
    if resources:
        resources = _map(resources)
        limits, requests = _map(resources.get("limits")), _map(resources.get("requests"))
    else:
        limits = requests = _EMPTY
    security = get("securityContext")
    privileged = bool(security) and _map(security).get("privileged") is True
    return ContainerView(kind, index, _text(get("name")), _text(get("image")), _text(get("restartPolicy")),
                         limits, requests, _entries(get("env")), _entries(get("envFrom")),
                         _entries(get("volumeMounts")), privileged, raw, f"/spec/{kind}/{index}")


def view_of(pod: Mapping[str, Any]) -> PodView:
    """The pod read once (see the module's note: fields of the wrong type read as absent)."""
    pod = _map(pod)
    metadata, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
    get = spec.get
    containers: list[ContainerView] = []
    for kind in CONTAINER_KINDS:
        given = get(kind)
        if given and isinstance(given, list):
            containers.extend(_container(kind, i, c if type(c) is dict else mapping_of(c))
                              for i, c in enumerate(given))
    meta = metadata.get
    return PodView(
        pod, _text(meta("name")) or _text(meta("generateName")), _text(meta("namespace")),
        _text(meta("uid")), _map(meta("annotations")), _map(meta("labels")),
        tuple(containers), _entries(get("volumes")), _map(get("nodeSelector")),
        _map(get("affinity")), _entries(get("tolerations")), _text(get("nodeName")),
        _text(get("schedulerName")), _text(get("runtimeClassName")), _entries(get("resourceClaims")),
        _map(get("overhead")), _entries(get("schedulingGates")),
    )


def view_for(request: PodRequest, pod: Mapping[str, Any] | None = None) -> PodView:
    """The view of `pod` (the request's own pod when None): the one the request carries when it is of
    that pod, else one made now."""
    pod = request.raw if pod is None else pod
    kept = request.view
    if isinstance(kept, PodView) and kept.raw is pod:
        return kept
    return view_of(pod)


def as_view(pod: Mapping[str, Any] | PodView) -> PodView:
    """A view, from a view or a raw pod (for callers that hold only the pod)."""
    return pod if isinstance(pod, PodView) else view_of(pod)


__all__ = ["CONTAINER_KINDS", "ContainerView", "PodView", "as_view", "view_for", "view_of"]
