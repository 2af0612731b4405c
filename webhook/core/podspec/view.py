"""A pod read once into typed fields: the domain's `PodView` (`domain/podview.py`), a `ContainerView` for
each of its containers.

An admission reads the pod once, in `podshape.read_pod`: when its quick type test finds every field the
webhook reads of exactly its JSON type, `checked_view` builds the view without testing types again;
`parse_pod` keeps the view with the request (`PodRequest.view`), and the rules, placement and patch
builders read its fields instead of walking the pod's mappings again. `view_of` builds one from any
mapping (a pod from the watch cache, a request made by hand): a field of the wrong type reads as absent,
as `coerce.py` reads it, so building a view never raises.

The raw pod (and each raw container) stays in the view as the base of patch values only: an `add`
replaces a whole field, so a patch builder copies what it leaves alone from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.domain.podview import CONTAINER_KINDS, EMPTY, NONE, ContainerView, PodView
from webhook.core.domain.request import PodRequest

from .coerce import mapping_of


def _text(value: object) -> str:
    if type(value) is str:
        return value
    return value if isinstance(value, str) else ""


def _map(value: Any) -> Mapping[str, Any]:
    """A mapping field, or one shared empty mapping (never written) when absent or of another type."""
    if type(value) is dict:
        return value
    return value if value is not None and isinstance(value, Mapping) else EMPTY


def _entries(value: object) -> tuple[Mapping[str, Any], ...]:
    """A list of mappings as a tuple; an entry of another type is left out (the shape check refuses it)."""
    if not value or not isinstance(value, list):
        return NONE
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
        claims = _entries(resources.get("claims"))
    else:
        limits = requests = EMPTY
        claims = NONE
    security = get("securityContext")
    privileged = bool(security) and _map(security).get("privileged") is True
    return ContainerView(kind, index, _text(get("name")), _text(get("image")), _text(get("restartPolicy")),
                         limits, requests, _entries(get("env")), _entries(get("envFrom")),
                         _entries(get("volumeMounts")), privileged, claims, raw)


def _checked_container(kind: str, index: int, raw: dict[str, Any]) -> ContainerView:
    """`_container` of a container whose fields have exactly the JSON types wanted (podshape's quick test
    passed): an absent field is None, a present one of its type, so no type test is needed."""
    get = raw.get
    resources = get("resources")
    if resources:
        limits, requests = resources.get("limits") or EMPTY, resources.get("requests") or EMPTY
        claims = _entries(resources.get("claims"))  # not in the shape check: its type is tested here
    else:
        limits = requests = EMPTY
        claims = NONE
    security = get("securityContext")
    privileged = security is not None and security.get("privileged") is True
    env, env_from, mounts = get("env"), get("envFrom"), get("volumeMounts")
    return ContainerView(kind, index, get("name") or "", get("image") or "", get("restartPolicy") or "",
                         limits, requests, tuple(env) if env else NONE, tuple(env_from) if env_from else NONE,
                         tuple(mounts) if mounts else NONE, privileged, claims, raw)


def _given(value: dict[str, Any] | None) -> Mapping[str, Any]:
    """A mapping field of a checked pod: an empty one stays itself, so that `absent` tells it from none."""
    return EMPTY if value is None else value




def checked_view(pod: dict[str, Any]) -> PodView:
    """The view of a pod whose every field read here has exactly its JSON type (podshape.read_pod calls
    this once its quick test passed): the same view as `view_of`, without testing each field's type."""
    metadata, spec = pod.get("metadata") or EMPTY, pod.get("spec") or EMPTY
    get = spec.get
    containers: list[ContainerView] = []
    for kind in CONTAINER_KINDS:
        given = get(kind)
        if given:
            containers.extend(_checked_container(kind, i, c) for i, c in enumerate(given))
    meta = metadata.get
    volumes, tolerations, claims, gates = get("volumes"), get("tolerations"), get("resourceClaims"), get(
        "schedulingGates")
    return PodView(
        pod, meta("name") or meta("generateName") or "", meta("namespace") or "", meta("uid") or "",
        _given(meta("annotations")), _given(meta("labels")), tuple(containers),
        tuple(volumes) if volumes else NONE, get("nodeSelector") or EMPTY, get("affinity") or EMPTY,
        tuple(tolerations) if tolerations else NONE, get("nodeName") or "", get("schedulerName") or "",
        get("runtimeClassName") or "", tuple(claims) if claims else NONE, get("overhead") or EMPTY,
        tuple(gates) if gates else NONE,
    )


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


EMPTY_POD = view_of({})  # the view of a pod that states nothing (placement's constraints of such pods)


def view_for(request: PodRequest, pod: Mapping[str, Any] | PodView | None = None) -> PodView:
    """The view of `pod` (the request's own pod when None): the one the request carries when it is of
    that pod, else one made now."""
    kept = request.view
    if pod is None:
        pod = request.raw
    elif isinstance(pod, PodView):
        return pod
    if kept is not None and kept.raw is pod:  # parse_pod keeps the view it read the request from
        return kept
    return view_of(pod)


def labels_and_annotations(pod: Mapping[str, Any] | PodView) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """A pod's labels and annotations, from its view or, for a caller that holds only the pod (the watch
    cache's pods, manifests), from its metadata without building a view."""
    if isinstance(pod, PodView):
        return pod.labels, pod.annotations
    metadata = _map(pod.get("metadata"))
    return _map(metadata.get("labels")), _map(metadata.get("annotations"))


def as_view(pod: Mapping[str, Any] | PodView) -> PodView:
    """A view, from a view or a raw pod (for callers that hold only the pod)."""
    return pod if isinstance(pod, PodView) else view_of(pod)


__all__ = ["EMPTY_POD", "as_view", "checked_view", "labels_and_annotations", "view_for", "view_of"]
