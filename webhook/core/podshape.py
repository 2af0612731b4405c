"""The types of the pod fields the webhook reads, checked before anything reads them.

The API server decodes a pod into typed structs before admission, so a real request always has the
right types; manifests given to `check`, and requests made by hand, need not. A field of the wrong type
(a mapping where a name is expected, a string where a list is) is refused with 422 naming the field,
instead of being misread or ending the request with an internal error. null is read as absent, as the
API server reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

# A check returns None, or (the path below the value, what was expected): the path is only built for
# an error, since every admission runs these on a valid pod (a field name is not formatted per field).
Error = tuple[str, str]
Check = Callable[[object], "Error | None"]


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


def _string(value: object) -> Error | None:
    return None if value is None or type(value) is str or isinstance(value, str) else (
        "", f"expected a string, got {_kind(value)}")


def _boolean(value: object) -> Error | None:
    return None if value is None or isinstance(value, bool) else ("", f"expected true or false, got {_kind(value)}")


def _integer(value: object) -> Error | None:
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
    return None if ok else ("", f"expected a whole number, got {_kind(value)}")


def _quantity(value: object) -> Error | None:
    ok = value is None or isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool))
    return None if ok else ("", f'expected a quantity such as 1 or "2Gi", got {_kind(value)}')


def _object(fields: Mapping[str, Check]) -> Check:
    """A mapping whose named fields have the given checks; other fields are not read here."""
    items = tuple(fields.items())
    strings = frozenset(name for name, field_check in items if field_check is _string)

    def check(value: object) -> Error | None:
        if value is None:
            return None
        if type(value) is not dict and not isinstance(value, Mapping):  # dict first: the ABC check is slow
            return "", f"expected a mapping, got {_kind(value)}"
        for name, field_check in items:
            entry = value.get(name)
            if entry is not None and not (type(entry) is str and name in strings):  # the common case, inline
                found = field_check(entry)
                if found:
                    return f".{name}{found[0]}", found[1]
        return None
    return check


def _list(item: Check) -> Check:
    def check(value: object) -> Error | None:
        if value is None:
            return None
        if not isinstance(value, list):
            return "", f"expected a list, got {_kind(value)}"
        for i, entry in enumerate(value):
            found = item(entry) if entry is not None else ("", "expected an entry, got null")
            if found:
                return f"[{i}]{found[0]}", found[1]
        return None
    return check


def _map_of(values: Check) -> Check:
    """A mapping of string keys to values of one check (labels, annotations, resource lists)."""
    def check(value: object) -> Error | None:
        if value is None:
            return None
        if type(value) is not dict and not isinstance(value, Mapping):
            return "", f"expected a mapping, got {_kind(value)}"
        for key, entry in value.items():
            if not isinstance(key, str):
                return "", f"key {key!r} is not a string"
            found = values(entry)
            if found:
                return f"[{key}]{found[0]}", found[1]
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
    found = _POD(pod)
    return f"{found[0].lstrip('.')}: {found[1]}" if found else None


__all__ = ["shape_error"]
