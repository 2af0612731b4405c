"""The types of the pod fields the webhook reads, checked before anything reads them.

The API server decodes a pod into typed structs before admission, so a real request always has the
right types; manifests given to `check`, and requests made by hand, need not. A field of the wrong type
(a mapping where a name is expected, a string where a list is) is refused with 422 naming the field,
instead of being misread or ending the request with an internal error. null is read as absent, as the
API server reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

Check = Callable[[object, str], "str | None"]


def _kind(value: object) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "a string" if isinstance(value, str) else type(value).__name__


def _string(value: object, where: str) -> str | None:
    return None if value is None or isinstance(value, str) else f"{where}: expected a string, got {_kind(value)}"


def _boolean(value: object, where: str) -> str | None:
    return None if value is None or isinstance(value, bool) else f"{where}: expected true or false, got {_kind(value)}"


def _integer(value: object, where: str) -> str | None:
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
    return None if ok else f"{where}: expected a whole number, got {_kind(value)}"


def _quantity(value: object, where: str) -> str | None:
    ok = value is None or isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool))
    return None if ok else f"{where}: expected a quantity such as 1 or \"2Gi\", got {_kind(value)}"


def _object(fields: Mapping[str, Check]) -> Check:
    """A mapping whose named fields have the given checks; other fields are not read here."""
    def check(value: object, where: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            return f"{where}: expected a mapping, got {_kind(value)}"
        for name, field_check in fields.items():
            found = field_check(value.get(name), f"{where}.{name}" if where else name)
            if found:
                return found
        return None
    return check


def _list(item: Check) -> Check:
    def check(value: object, where: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, list):
            return f"{where}: expected a list, got {_kind(value)}"
        for i, entry in enumerate(value):
            found = item(entry, f"{where}[{i}]") if entry is not None else f"{where}[{i}]: expected an entry, got null"
            if found:
                return found
        return None
    return check


def _map_of(values: Check) -> Check:
    """A mapping of string keys to values of one check (labels, annotations, resource lists)."""
    def check(value: object, where: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            return f"{where}: expected a mapping, got {_kind(value)}"
        for key, entry in value.items():
            if not isinstance(key, str):
                return f"{where}: key {key!r} is not a string"
            found = values(entry, f"{where}[{key}]")
            if found:
                return found
        return None
    return check


_REF = _object({"name": _string, "optional": _boolean, "key": _string})
_ENV = _object({"name": _string, "value": _string,
                "valueFrom": _object({"configMapKeyRef": _REF, "secretKeyRef": _REF})})
_ENV_FROM = _object({"prefix": _string, "configMapRef": _REF, "secretRef": _REF})
_RESOURCES = _object({"limits": _map_of(_quantity), "requests": _map_of(_quantity)})
_CONTAINER = _object({
    "name": _string, "image": _string, "restartPolicy": _string,
    "env": _list(_ENV), "envFrom": _list(_ENV_FROM), "resources": _RESOURCES,
    "securityContext": _object({"privileged": _boolean}),
    "volumeMounts": _list(_object({"name": _string, "mountPath": _string, "subPath": _string})),
    "ports": _list(_object({"name": _string, "containerPort": _integer, "hostPort": _integer})),
})
_REQUIREMENT = _object({"key": _string, "operator": _string, "values": _list(_string)})
_TERM = _object({"matchExpressions": _list(_REQUIREMENT), "matchFields": _list(_REQUIREMENT)})
_NODE_AFFINITY = _object({
    "requiredDuringSchedulingIgnoredDuringExecution": _object({"nodeSelectorTerms": _list(_TERM)}),
    "preferredDuringSchedulingIgnoredDuringExecution": _list(_object({"weight": _integer, "preference": _TERM})),
})
_ANY_OBJECT = _object({})
_SPEC = _object({
    "containers": _list(_CONTAINER), "initContainers": _list(_CONTAINER), "ephemeralContainers": _list(_CONTAINER),
    "volumes": _list(_object({"name": _string, "hostPath": _object({"path": _string, "type": _string})})),
    "affinity": _object({"nodeAffinity": _NODE_AFFINITY, "podAffinity": _ANY_OBJECT,
                         "podAntiAffinity": _ANY_OBJECT}),
    "tolerations": _list(_object({"key": _string, "operator": _string, "value": _string, "effect": _string,
                                  "tolerationSeconds": _integer})),
    "nodeSelector": _map_of(_string),
    "schedulerName": _string, "nodeName": _string, "runtimeClassName": _string,
    "resourceClaims": _list(_object({"name": _string, "resourceClaimName": _string,
                                     "resourceClaimTemplateName": _string})),
})
_POD = _object({
    "metadata": _object({"name": _string, "generateName": _string, "namespace": _string, "uid": _string,
                         "annotations": _map_of(_string), "labels": _map_of(_string)}),
    "spec": _SPEC,
})


def shape_error(pod: object) -> str | None:
    """The first field of the pod whose type is wrong, with what was expected; None when all are right."""
    if not isinstance(pod, Mapping):
        return f"the object is not a pod: expected a mapping, got {_kind(pod)}"
    return _POD(pod, "")


__all__ = ["shape_error"]
