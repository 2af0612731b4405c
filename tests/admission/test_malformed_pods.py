"""Pods whose fields have the wrong type, at every level the webhook reads, through the core's mutate and
validate: each is refused with 422 naming the field, or (a field the webhook does not read) admitted as
it would be otherwise; never an exception, which the server would answer with a 500."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import jsonpatch
import pytest
from builders import A100, node, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.core.admission import admit
from webhook.core.policy.model import Policy

CLUSTER = snapshot(node("a1", A100, 8))
POLICY = Policy()
PATH = tuple[str | int, ...]
TERM = {"matchExpressions": [{"key": "k", "operator": "NotIn", "values": ["v"]}],
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a1"]}]}


def _container(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "cuda:12", "env": [{"name": "A", "value": "b"},
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}], **extra}


def _gpu_pod() -> dict[str, Any]:
    main = _container("main", resources={"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000},
                                         "requests": {"cpu": "1"}},
                      envFrom=[{"configMapRef": {"name": "c"}, "prefix": "P_"},
                               {"secretRef": {"name": "s"}, "prefix": "S_"}],
                      ports=[{"containerPort": 80}], volumeMounts=[{"name": "v", "mountPath": "/d"}],
                      securityContext={"privileged": False})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team-a", "labels": {"app": "x"},
                         "annotations": {"nvidia.com/use-gputype": "A100"}},
            "spec": {"containers": [main], "initContainers": [_container("init", restartPolicy="Always")],
                     "ephemeralContainers": [_container("debug")],
                     "volumes": [{"name": "v", "hostPath": {"path": "/data"}},
                                 {"name": "w", "configMap": {"name": "c"}}],
                     "affinity": {"nodeAffinity": {
                         "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [TERM]},
                         "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": TERM}]}},
                     "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule",
                                      "tolerationSeconds": 3}],
                     "nodeSelector": {"nvidia.com/gpu.product": A100[0]}}}


def _kai_pod() -> dict[str, Any]:
    p = _gpu_pod()
    p["metadata"]["annotations"]["gpu-fraction"] = "0.5"
    p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    return p


def _reaching_pod() -> dict[str, Any]:
    """No GPU asked, but a GPU runtime: the webhook neutralises its containers."""
    p = _gpu_pod()
    p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    p["spec"]["runtimeClassName"] = "nvidia"
    return p


def _mutated(p: dict[str, Any]) -> dict[str, Any]:
    m = admit.mutate(p, CLUSTER, POLICY)
    assert m.allowed, m.message
    patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    patched["metadata"]["uid"] = "uid-1"
    assert admit.validate(patched, CLUSTER, POLICY).allowed
    return patched


BASES = {"gpu": _gpu_pod(), "kai": _kai_pod(), "reaching": _reaching_pod()}
MUTATED = {name: _mutated(p) for name, p in BASES.items()}
SUBTREES = ("containers", "initContainers", "ephemeralContainers", "volumes", "affinity", "tolerations",
            "nodeSelector", "runtimeClassName", "schedulerName")


def _paths(value: Any, path: PATH = ()) -> Iterator[PATH]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*path, i))


def _fuzzable(pod: dict[str, Any]) -> list[PATH]:
    found = [p for p in _paths(pod) if len(p) >= 2 and p[0] == "spec" and p[1] in SUBTREES]
    found += [p for p in _paths(pod) if len(p) >= 2 and p[:2] in (("metadata", "annotations"), ("metadata", "labels"))]
    return [*found, ("spec",), ("metadata",), ("spec", "containers")]


def _type(value: Any) -> str:
    return {dict: "map", list: "list", str: "str", bool: "bool", int: "num", float: "num"}.get(type(value), "null")


_SCALARS = st.one_of(st.text(max_size=8), st.integers(-5, 5), st.floats(allow_nan=False, width=32), st.booleans())
JUNK = st.recursive(st.one_of(st.none(), _SCALARS),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                    max_leaves=6)


def _set(pod: dict[str, Any], path: PATH, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    target: Any = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def _get(pod: dict[str, Any], path: PATH) -> Any:
    target: Any = pod
    for key in path:
        target = target[key]
    return target


def _case(stage: str) -> Any:
    pods = BASES if stage == "mutate" else MUTATED

    @st.composite
    def build(draw: Any) -> tuple[dict[str, Any], Any, Any]:
        base = pods[draw(st.sampled_from(sorted(pods)))]
        path = draw(st.sampled_from(_fuzzable(base)))
        old = _get(base, path)
        value = draw(JUNK.filter(lambda v: _type(v) != _type(old)))
        return _set(base, path, value), old, value
    return build()


def _decide(stage: str, pod: dict[str, Any]) -> Any:
    fn = admit.mutate if stage == "mutate" else admit.validate
    return fn(pod, CLUSTER, POLICY)


@pytest.mark.parametrize("stage", ["mutate", "validate"])
def test_wrong_types_anywhere_are_refused_or_admitted_never_raised(stage: str) -> None:
    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_case(stage))
    def run(case: tuple[dict[str, Any], Any, Any]) -> None:
        pod, _, value = case
        decision = _decide(stage, pod)  # an exception here is the failure
        if value is None:
            assert decision.allowed or decision.code != 500  # null is absent: any clean decision
        else:
            assert decision.allowed or decision.code == 422, decision
            if not decision.allowed and decision.reason == "invalid-pod":  # names the field at fault
                assert decision.message.startswith(("spec", "metadata")), decision.message
    run()


@pytest.mark.parametrize("stage", ["mutate", "validate"])
@pytest.mark.parametrize("name", [{"a": 1}, ["CUDA_DEVICE_SM_LIMIT"], 7])
def test_an_env_name_that_is_not_a_string_is_named(stage: str, name: Any) -> None:
    pod = copy.deepcopy((BASES if stage == "mutate" else MUTATED)["gpu"])
    pod["spec"]["containers"][0]["env"].append({"name": name, "value": "1"})
    decision = _decide(stage, pod)
    assert (decision.allowed, decision.code, decision.reason) == (False, 422, "invalid-pod")
    assert decision.message.startswith("spec.containers[0].env[")
    got = "a mapping" if isinstance(name, dict) else "a list" if isinstance(name, list) else "a number"
    assert decision.message.endswith(f"].name: expected a string, got {got}")


@pytest.mark.parametrize(("path", "value", "field"), [
    (("spec", "affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution"), 3,
     "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution: expected a list, got a number"),
    (("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms", 0,
      "matchFields"), "x", "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
                           "nodeSelectorTerms[0].matchFields: expected a list, got a string"),
    (("spec", "tolerations", 0, "key"), {"k": 1}, "spec.tolerations[0].key: expected a string, got a mapping"),
    (("metadata", "annotations", "nvidia.com/use-gputype"), ["A100"],
     "metadata.annotations[nvidia.com/use-gputype]: expected a string, got a list"),
])
def test_fields_that_crashed_placement_are_named(path: PATH, value: Any, field: str) -> None:
    for stage, pods in (("mutate", BASES), ("validate", MUTATED)):
        decision = _decide(stage, _set(pods["gpu"], path, value))
        assert (decision.allowed, decision.code, decision.message) == (False, 422, field)
