"""The pod read once into a view: what the view says is what the raw pod says, one view per admission,
and a request given another pod never keeps the old pod's view."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import H100, node, pod, snapshot

from webhook.core.admission import admit
from webhook.core.domain.podview import PodView
from webhook.core.podspec import podshape
from webhook.core.podspec import view as views
from webhook.core.podspec.resources import parse_pod
from webhook.core.podspec.view import view_for, view_of
from webhook.core.policy.model import Policy

SNAP = snapshot(node("n1", H100, 8))


def _full_pod() -> dict[str, Any]:
    app = {"name": "main", "image": "cuda:12",
           "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}, "requests": {"memory": "1Gi"}},
           "env": [{"name": "A", "value": "1"}], "envFrom": [{"configMapRef": {"name": "settings"}}],
           "volumeMounts": [{"name": "data", "mountPath": "/data"}], "securityContext": {"privileged": True}}
    side = {"name": "proxy", "image": "envoy", "restartPolicy": "Always"}
    init = {"name": "setup", "image": "busybox", "envFrom": [{"prefix": "APP_", "secretRef": {"name": "db"}}]}
    debug = {"name": "debugger", "image": "busybox", "volumeMounts": [{"name": "data", "mountPath": "/mnt"}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}
    return {
        "metadata": {"generateName": "train-", "namespace": "team-a", "uid": "u-1",
                     "annotations": {"a": "b"}, "labels": {"app": "train"}},
        "spec": {
            "containers": [app], "initContainers": [side, init], "ephemeralContainers": [debug],
            "volumes": [{"name": "data", "emptyDir": {}}], "nodeSelector": {"zone": "a"}, "affinity": affinity,
            "tolerations": [{"key": "k", "operator": "Exists"}], "schedulerName": "volcano",
            "runtimeClassName": "nvidia", "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
            "overhead": {"cpu": "100m"}, "schedulingGates": [{"name": "wait"}],
        },
    }


def test_the_view_says_what_the_raw_pod_says() -> None:
    raw = _full_pod()
    view = view_of(raw)
    spec, meta = raw["spec"], raw["metadata"]
    assert view.raw is raw
    assert (view.name, view.namespace, view.uid) == ("train-", "team-a", "u-1")
    assert view.annotations == meta["annotations"] and view.labels == meta["labels"]
    assert [(c.kind, c.index, c.name) for c in view.containers] == [
        ("containers", 0, "main"), ("initContainers", 0, "proxy"), ("initContainers", 1, "setup"),
        ("ephemeralContainers", 0, "debugger")]
    assert [c.name for c in view.app] == ["main"]
    assert [c.name for c in view.init] == ["proxy", "setup"]
    assert [c.name for c in view.ephemeral] == ["debugger"]
    main, proxy, setup, debugger = view.containers
    assert main.raw is spec["containers"][0] and main.path == "/spec/containers/0"
    assert setup.path == "/spec/initContainers/1" and debugger.path == "/spec/ephemeralContainers/0"
    assert (main.image, main.limits, main.requests) == ("cuda:12", {"nvidia.com/gpu": "1", "cpu": "2"},
                                                        {"memory": "1Gi"})
    assert list(main.env) == spec["containers"][0]["env"] and list(main.env_from) == [
        {"configMapRef": {"name": "settings"}}]
    assert list(setup.env_from) == spec["initContainers"][1]["envFrom"]
    assert list(main.volume_mounts) == [{"name": "data", "mountPath": "/data"}]
    assert list(debugger.volume_mounts) == [{"name": "data", "mountPath": "/mnt"}]
    assert main.privileged and not proxy.privileged
    assert (proxy.restart_policy, setup.restart_policy) == ("Always", "")
    assert view.container("initContainers", 1) is setup and view.container("containers", 3) is None
    assert list(view.volumes) == spec["volumes"] and view.node_selector == {"zone": "a"}
    assert view.affinity == spec["affinity"] and list(view.tolerations) == spec["tolerations"]
    assert (view.node_name, view.scheduler_name, view.runtime_class_name) == ("", "volcano", "nvidia")
    assert list(view.resource_claims) == spec["resourceClaims"] and view.overhead == {"cpu": "100m"}
    assert list(view.scheduling_gates) == [{"name": "wait"}]


def test_a_view_of_a_pod_with_wrong_types_reads_them_as_absent() -> None:
    view = view_of({"metadata": {"name": 5, "annotations": []}, "spec": {"containers": "x", "volumes": {}}})
    assert (view.name, view.annotations, view.containers, view.volumes) == ("", {}, (), ())
    odd = view_of({"spec": {"containers": [{"name": "c", "env": [None, {"name": "A"}], "envFrom": ("x",)}]}})
    (container,) = odd.containers
    assert container.env == ({"name": "A"},) and container.env_from == ()


def test_the_parsed_request_carries_the_view_of_its_own_pod() -> None:
    raw = _full_pod()
    request = parse_pod(raw)
    assert isinstance(request.view, PodView) and request.view.raw is raw
    assert view_for(request) is request.view
    assert request.evolve(gpus=3).view is request.view


def test_a_request_evolved_with_another_pod_never_keeps_the_old_view() -> None:
    request = parse_pod(_full_pod())
    other = pod({"nvidia.com/gpu": "2"}, name="q")
    moved = request.evolve(raw=other)
    assert moved.view is None
    assert view_for(moved).raw is other and view_for(moved).app[0].limits == {"nvidia.com/gpu": "2"}
    assert request.evolve(raw=request.raw).view is request.view


def test_a_request_made_from_the_blank_one_never_carries_another_pods_view() -> None:
    first, second = pod({"nvidia.com/gpu": "1"}, name="a"), pod({"nvidia.com/gpu": "1"}, name="b")
    one, two = parse_pod(first), parse_pod(second)
    assert isinstance(one.view, PodView) and isinstance(two.view, PodView)
    assert one.view.raw is first and two.view.raw is second and one.view is not two.view


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every view built, by either builder, wherever it is called from."""
    calls: list[str] = []

    def counted(real: Any) -> Any:
        def build(raw: Any) -> PodView:
            calls.append(real.__name__)
            view: PodView = real(raw)
            return view
        return build
    for module, name in ((views, "view_of"), (podshape, "view_of"), (podshape, "checked_view")):
        monkeypatch.setattr(module, name, counted(getattr(module, name)))
    return calls


def test_one_view_is_built_per_mutation(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    decision = admit.mutate(pod({"nvidia.com/gpu": "1"}), SNAP, Policy())
    assert decision.allowed and decision.patch
    assert calls == ["checked_view"]  # the pod is well formed: built once, without type tests


def test_one_view_is_built_per_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    decision = admit.mutate(pod({"nvidia.com/gpu": "1"}), SNAP, Policy())
    final = _patched(pod({"nvidia.com/gpu": "1"}), decision.patch)
    calls = _counting(monkeypatch)
    assert admit.validate(final, SNAP, Policy()).allowed
    assert calls == ["checked_view"]  # the pod is well formed: built once, without type tests


def _patched(raw: dict[str, Any], ops: Any) -> dict[str, Any]:
    jsonpatch = pytest.importorskip("jsonpatch")
    patched: dict[str, Any] = jsonpatch.apply_patch(raw, [dict(op) for op in ops])
    return patched


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _pods_in(value: Any) -> Iterator[dict[str, Any]]:
    """Every pod and pod template inside a decoded manifest or review: a mapping whose spec has containers."""
    if isinstance(value, dict):
        spec = value.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("containers"), list):
            yield value
        for item in value.values():
            yield from _pods_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _pods_in(item)


def _fixture_pods() -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = []
    for path in sorted(FIXTURES.rglob("*")):
        if path.suffix == ".json":
            pods += _pods_in(json.loads(path.read_text()))
        elif path.suffix in (".yaml", ".yml"):
            for text in path.read_text().split("\n---"):
                try:
                    pods += _pods_in(yaml.safe_load(text))
                except yaml.YAMLError:  # the fixtures of bad input
                    continue
    return pods


def test_the_checked_view_of_every_public_manifest_is_the_view() -> None:
    """read_pod builds a well-formed pod's view without type tests: it must be the same view."""
    pods = _fixture_pods()
    assert len(pods) > 100
    checked = 0
    for raw in pods:
        read = podshape.read_pod(raw)
        if isinstance(read, str):  # a template the shape check refuses: nothing to compare
            continue
        assert read == view_of(raw), raw.get("metadata")
        checked += 1
    assert checked > 100


def test_a_pod_of_wrong_types_is_refused_by_the_one_reader_with_the_field_path() -> None:
    raw = pod({"nvidia.com/gpu": "1"})
    raw["spec"]["containers"][0]["securityContext"] = {"privileged": "true"}
    assert podshape.read_pod(raw) == "spec.containers[0].securityContext.privileged: expected true or false, " \
                                     "got a string"
    raw["spec"]["containers"][0]["securityContext"] = None
    assert isinstance(podshape.read_pod(raw), PodView)


# Each field of the view, the pod field it is read from, and a value of the wrong type for it. A field
# added to the view must be added here, and so to the shape check (podshape._SPEC): the view is built
# without type tests only for a pod the shape check passed.
POD_FIELDS: dict[str, tuple[str, Any]] = {
    "name": ("metadata.name", 1), "namespace": ("metadata.namespace", []), "uid": ("metadata.uid", {}),
    "annotations": ("metadata.annotations", []), "labels": ("metadata.labels", "x"),
    "volumes": ("spec.volumes", {}), "node_selector": ("spec.nodeSelector", []),
    "affinity": ("spec.affinity", []), "tolerations": ("spec.tolerations", {}),
    "node_name": ("spec.nodeName", 1), "scheduler_name": ("spec.schedulerName", True),
    "runtime_class_name": ("spec.runtimeClassName", {}), "resource_claims": ("spec.resourceClaims", "x"),
    "overhead": ("spec.overhead", []), "scheduling_gates": ("spec.schedulingGates", {}),
}
CONTAINER_FIELDS: dict[str, tuple[str, Any]] = {
    "name": ("name", 1), "image": ("image", []), "restart_policy": ("restartPolicy", {}),
    "limits": ("resources.limits", []), "requests": ("resources.requests", "x"), "env": ("env", {}),
    "env_from": ("envFrom", "x"), "volume_mounts": ("volumeMounts", {}),
    "privileged": ("securityContext.privileged", "true"),
}
_NOT_READ_FROM_ONE_FIELD = {"raw", "containers", "kind", "index", "claims"}  # claims: type-tested as read


def _set(raw: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        raw = raw.setdefault(part, {})
    raw[last] = value


def test_every_field_of_the_view_is_type_checked_before_the_view_is_built_without_type_tests() -> None:
    from dataclasses import fields

    from webhook.core.domain.podview import ContainerView

    assert {f.name for f in fields(PodView)} - _NOT_READ_FROM_ONE_FIELD == POD_FIELDS.keys()
    assert {f.name for f in fields(ContainerView)} - _NOT_READ_FROM_ONE_FIELD == CONTAINER_FIELDS.keys()
    cases = [(path, wrong) for path, wrong in POD_FIELDS.values()]
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        cases += [(f"spec.{kind}.0.{path}", wrong) for path, wrong in CONTAINER_FIELDS.values()]
    for path, wrong in cases:
        raw = pod({"nvidia.com/gpu": "1"})
        raw["spec"].setdefault("initContainers", [{"name": "init"}])
        raw["spec"].setdefault("ephemeralContainers", [{"name": "debug"}])
        if ".0." in path:
            before, after = path.split(".0.")
            container: dict[str, Any] = raw["spec"][before.removeprefix("spec.")][0]
            _set(container, after, wrong)
            shown = f"{before}[0].{after}"
        else:
            _set(raw, path, wrong)
            shown = path
        read = podshape.read_pod(raw)
        assert isinstance(read, str) and read.startswith(shown + ":"), (path, read)


def test_a_container_s_claims_of_the_wrong_type_read_as_none_in_either_builder() -> None:
    raw = pod({"nvidia.com/gpu": "1"})
    raw["spec"]["containers"][0]["resources"]["claims"] = "gpu"
    read = podshape.read_pod(raw)
    assert isinstance(read, PodView) and read.containers[0].claims == () == view_of(raw).containers[0].claims
    raw["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    read = podshape.read_pod(raw)
    assert isinstance(read, PodView) and read.containers[0].claims == ({"name": "gpu"},)
