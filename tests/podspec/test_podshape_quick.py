"""The quick test of a pod's shape never passes a pod the field-by-field check refuses, so the 422
message for a malformed pod is the one the field-by-field check words, whatever the quick test says."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.core.podspec import podshape
from webhook.core.podspec.podshape import _POD, _POD_CHECK, _POD_QUICK, Shape, _List, _MapOf, _Object, shape_error


class Text(str):
    """A str subclass: a string to the field-by-field check, not exactly a JSON string."""


_WRONG = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False, width=32),
                   st.text(max_size=3), st.builds(Text, st.text(max_size=3)), st.just([]), st.just({}),
                   st.just([None]), st.just({1: "x"}), st.just({"k": None}))
_LEAVES: dict[Any, Any] = {
    podshape._string: st.one_of(st.text(max_size=4), st.builds(Text, st.text(max_size=3))),
    podshape._boolean: st.booleans(),
    podshape._integer: st.integers(-5, 5),
    podshape._quantity: st.one_of(st.just("1"), st.integers(0, 8), st.floats(0, 8, width=32)),
}


def _value(shape: Shape, draw: Any, depth: int = 0) -> Any:
    """A value of the shape, or, now and then (more often deeper down), something of another type."""
    if draw(st.integers(0, 12)) == 0:
        return draw(_WRONG)
    if isinstance(shape, _Object):
        names = draw(st.lists(st.sampled_from(sorted(shape.fields)), max_size=len(shape.fields), unique=True)
                     ) if shape.fields else []
        out = {name: _value(shape.fields[name], draw, depth + 1) for name in names}
        if draw(st.booleans()):
            out["unread"] = draw(_WRONG)  # a field the webhook does not read: never looked at
        return out
    if isinstance(shape, _List):
        return [_value(shape.item, draw, depth + 1) for _ in range(draw(st.integers(0, 2)))]
    if isinstance(shape, _MapOf):
        return {draw(st.text(max_size=3)): _value(shape.values, draw, depth + 1)
                for _ in range(draw(st.integers(0, 2)))}
    return draw(_LEAVES[shape])


@st.composite
def pods(draw: Any) -> Any:
    return _value(_POD, draw)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods())
def test_the_quick_test_passes_only_pods_the_field_checks_pass(pod: Any) -> None:
    precise = _POD_CHECK(pod) if isinstance(pod, dict) else ("", "not a mapping")
    if type(pod) is dict and _POD_QUICK(pod):
        assert precise is None
    expected = None if precise is None else f"{precise[0].lstrip('.')}: {precise[1]}"
    if isinstance(pod, dict):
        assert shape_error(pod) == expected


def test_a_well_formed_pod_passes_quickly_and_a_subclass_goes_to_the_field_checks() -> None:
    pod = {"metadata": {"name": "p", "labels": {"a": "b"}},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}},
                                    "ports": [{"containerPort": 80}]}],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In",
                                                                     "values": ["v"]}]}]}}}}}
    assert _POD_QUICK(pod) and shape_error(pod) is None
    pod["spec"]["containers"][0]["name"] = Text("c")  # a string all the same: no error, found the slow way
    assert not _POD_QUICK(pod) and shape_error(pod) is None
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = True
    assert shape_error(pod) == "spec.containers[0].ports[0].containerPort: expected a whole number, got a boolean"
    pod["spec"]["containers"][0]["ports"] = [None]
    assert shape_error(pod) == "spec.containers[0].ports[0]: expected an entry, got null"


def test_the_overhead_and_scheduling_gates_the_webhook_reads_are_type_checked_first() -> None:
    # Read by the host-usage and group-gate code: a wrong type is the parser's 422 with the field's path,
    # never an exception or a silently skipped value further on.
    base = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    overhead = {**base, "spec": {**base["spec"], "overhead": {"cpu": ["250m"]}}}
    assert shape_error(overhead) is not None and shape_error(overhead).startswith("spec.overhead[cpu]")
    gates = {**base, "spec": {**base["spec"], "schedulingGates": [None]}}
    assert shape_error(gates) == "spec.schedulingGates[0]: expected an entry, got null"
    fine = {**base, "spec": {**base["spec"], "overhead": {"cpu": "250m"}, "schedulingGates": [{"name": "g"}]}}
    assert shape_error(fine) is None and _POD_QUICK(fine)
