"""The types of the pod fields the webhook reads, checked before anything reads them.

The API server decodes a pod into typed structs before admission, so a real request always has the
right types; manifests given to `check`, and requests made by hand, need not. A field of the wrong type
(a mapping where a name is expected, a string where a list is) is refused with 422 naming the field,
instead of being misread or ending the request with an internal error. null is read as absent, as the
API server reads it.

Every admission runs this on a pod that is almost always well formed, so the check is made twice from
one schema: a quick test, compiled to straight-line code, that only says "all exactly the JSON types
wanted", and the field-by-field checks below, run only when the quick test is unsure, which find the
field at fault and word the message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from webhook.core.domain.podview import PodView

from .view import checked_view, view_of

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


class _Object(NamedTuple):
    fields: dict[str, Shape]  # the fields the webhook reads; others are not checked


class _List(NamedTuple):
    item: Shape


class _MapOf(NamedTuple):
    values: Shape  # keys are strings


Shape = Check | _Object | _List | _MapOf  # a leaf is its check (_string, _boolean, _integer, _quantity)

_REF = _Object({"name": _string, "optional": _boolean, "key": _string})
_ENV = _Object({"name": _string, "value": _string,
                "valueFrom": _Object({"configMapKeyRef": _REF, "secretKeyRef": _REF})})
_ENV_FROM = _Object({"prefix": _string, "configMapRef": _REF, "secretRef": _REF})
_RESOURCES = _Object({"limits": _MapOf(_quantity), "requests": _MapOf(_quantity)})
_CONTAINER = _Object({
    "name": _string, "image": _string, "restartPolicy": _string,
    "env": _List(_ENV), "envFrom": _List(_ENV_FROM), "resources": _RESOURCES,
    "securityContext": _Object({"privileged": _boolean}),
    "volumeMounts": _List(_Object({"name": _string, "mountPath": _string, "subPath": _string})),
    "ports": _List(_Object({"name": _string, "containerPort": _integer, "hostPort": _integer})),
})
_REQUIREMENT = _Object({"key": _string, "operator": _string, "values": _List(_string)})
_TERM = _Object({"matchExpressions": _List(_REQUIREMENT), "matchFields": _List(_REQUIREMENT)})
_NODE_AFFINITY = _Object({
    "requiredDuringSchedulingIgnoredDuringExecution": _Object({"nodeSelectorTerms": _List(_TERM)}),
    "preferredDuringSchedulingIgnoredDuringExecution": _List(_Object({"weight": _integer, "preference": _TERM})),
})
_ANY_OBJECT = _Object({})
_SPEC = _Object({
    "containers": _List(_CONTAINER), "initContainers": _List(_CONTAINER), "ephemeralContainers": _List(_CONTAINER),
    "volumes": _List(_Object({"name": _string, "hostPath": _Object({"path": _string, "type": _string})})),
    "affinity": _Object({"nodeAffinity": _NODE_AFFINITY, "podAffinity": _ANY_OBJECT,
                         "podAntiAffinity": _ANY_OBJECT}),
    "tolerations": _List(_Object({"key": _string, "operator": _string, "value": _string, "effect": _string,
                                  "tolerationSeconds": _integer})),
    "nodeSelector": _MapOf(_string),
    "schedulerName": _string, "nodeName": _string, "runtimeClassName": _string,
    "resourceClaims": _List(_Object({"name": _string, "resourceClaimName": _string,
                                     "resourceClaimTemplateName": _string})),
    "overhead": _MapOf(_quantity), "schedulingGates": _List(_Object({"name": _string})),
})
_POD = _Object({
    "metadata": _Object({"name": _string, "generateName": _string, "namespace": _string, "uid": _string,
                         "annotations": _MapOf(_string), "labels": _MapOf(_string)}),
    "spec": _SPEC,
})


def _checker(shape: Shape) -> Check:
    """The field-by-field check of a shape, which says where and what is wrong."""
    if isinstance(shape, _Object):
        return _object({name: _checker(field) for name, field in shape.fields.items()})
    if isinstance(shape, _List):
        return _list(_checker(shape.item))
    if isinstance(shape, _MapOf):
        return _map_of(_checker(shape.values))
    return shape


# The exact types a decoded JSON value has when a leaf check passes it (a subclass, or a bool where a
# number is wanted, goes to the field-by-field check).
_EXACT: dict[Check, tuple[type, ...]] = {
    _string: (str,), _boolean: (bool,), _integer: (int,), _quantity: (str, int, float),
}


def _quick_source(shape: Shape, var: str, depth: int, pad: str, out: list[str]) -> None:
    """Lines that fall through when `var` (not None) is exactly of the shape, and return False otherwise
    (None inside a list is refused by the type test). Only names of the schema reach the code, by repr()."""
    inner = f"v{depth + 1}"
    if isinstance(shape, _Object):
        out.append(f"{pad}if type({var}) is not dict: return False")
        for name, field in shape.fields.items():
            out.append(f"{pad}{inner} = {var}.get({name!r})")
            if isinstance(field, (_Object, _List, _MapOf)):
                out.append(f"{pad}if {inner} is not None:")
                _quick_source(field, inner, depth + 1, pad + "    ", out)
            else:
                out.append(f"{pad}if {inner} is not None and {_leaf_test(field, inner)}: return False")
    elif isinstance(shape, _List):
        out.append(f"{pad}if type({var}) is not list: return False")
        out.append(f"{pad}for {inner} in {var}:")
        if isinstance(shape.item, (_Object, _List, _MapOf)):
            _quick_source(shape.item, inner, depth + 1, pad + "    ", out)
        else:
            out.append(f"{pad}    if {_leaf_test(shape.item, inner)}: return False")
    elif isinstance(shape, _MapOf):
        out.append(f"{pad}if type({var}) is not dict: return False")
        out.append(f"{pad}for k{depth}, {inner} in {var}.items():")
        out.append(f"{pad}    if type(k{depth}) is not str: return False")
        if isinstance(shape.values, (_Object, _List, _MapOf)):
            out.append(f"{pad}    if {inner} is not None:")
            _quick_source(shape.values, inner, depth + 1, pad + "        ", out)
        else:
            out.append(f"{pad}    if {inner} is not None and {_leaf_test(shape.values, inner)}: return False")
    else:
        out.append(f"{pad}if {_leaf_test(shape, var)}: return False")


def _leaf_test(check: Check, var: str) -> str:
    types = _EXACT[check]
    return f"type({var}) is not {types[0].__name__}" if len(types) == 1 else f"type({var}) not in _QUANTITY"


def _quick(shape: Shape) -> Callable[[object], bool]:
    """True only when the value is of the shape with exactly the JSON types wanted (then the checks
    find nothing); False when it may not be, for the field-by-field check to decide."""
    lines = ["def quick(v0):"]
    _quick_source(shape, "v0", 0, "    ", lines)
    lines.append("    return True")
    namespace: dict[str, Any] = {"_QUANTITY": frozenset(_EXACT[_quantity])}
    exec(compile("\n".join(lines), "<podshape quick test>", "exec"), namespace)  # schema code, never request data
    quick: Callable[[object], bool] = namespace["quick"]
    return quick


_POD_CHECK = _checker(_POD)
_POD_QUICK = _quick(_POD)


def read_pod(pod: object) -> PodView | str:
    """The pod's view (view.py), or what is wrong with the first field of the wrong type: the one place
    an admission reads the pod's fields and their types."""
    if type(pod) is dict and _POD_QUICK(pod):  # the usual pod: exactly the JSON types wanted
        return checked_view(pod)
    malformed = _field_error(pod)
    if malformed is not None:
        return malformed
    assert isinstance(pod, Mapping)  # _field_error refuses anything else
    return view_of(pod)


def shape_error(pod: object) -> str | None:
    """The first field of the pod whose type is wrong, with what was expected; None when all are right."""
    if type(pod) is dict and _POD_QUICK(pod):  # the usual pod
        return None
    return _field_error(pod)


def _field_error(pod: object) -> str | None:
    """`shape_error` field by field, for a pod the quick test was unsure of."""
    if not isinstance(pod, Mapping):
        return f"the object is not a pod: expected a mapping, got {_kind(pod)}"
    found = _POD_CHECK(pod)
    return f"{found[0].lstrip('.')}: {found[1]}" if found else None


__all__ = ["read_pod", "shape_error"]
