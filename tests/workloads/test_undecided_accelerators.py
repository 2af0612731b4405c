"""`check` never passes a document that asks for an accelerator where it decided no pod: an unknown kind
with a GPU anywhere in it, or a known kind with a GPU in a field its controller never puts into a pod,
is an input error (exit 2). Objects stating capacity with GPU names are not asks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from webhook.cli import main
from webhook.manifests import Document, Problem, read_all
from webhook.workloads import Skipped, pod_templates, workloads
from webhook.workloads.accelerators import find

WRITTEN = Path(__file__).parent.parent / "fixtures" / "workloads" / "written"


def test_written_undecided_accelerators_are_input_errors_naming_the_field() -> None:
    rows = [(type(r).__name__, r.kind, getattr(r, "field", "")) for r in
            workloads(read_all([str(WRITTEN / "undecided-accelerators.yaml")]))]
    assert rows == [
        ("Problem", "ModelServer", "spec.resources.limits.nvidia.com/gpu"),
        ("Problem", "BatchRunner", "spec.worker.gpu"),
        ("Problem", "Trainer", "spec.numGpus"),  # its walked template (a log shipper) is not where the GPUs are
        ("Problem", "PyTorchJob", "spec.resources.limits.nvidia.com/gpu"),
        ("Skipped", "ClusterQueue", ""),
        ("Skipped", "ResourceQuota", ""),
    ]


def test_messages_say_what_was_asked_and_why_it_was_not_decided() -> None:
    server, runner, _, misplaced, *_ = workloads(read_all([str(WRITTEN / "undecided-accelerators.yaml")]))
    assert isinstance(server, Problem) and server.message == (
        "asks for accelerators that check did not decide: spec.resources.limits.nvidia.com/gpu (nvidia.com/gpu: 1); "
        "ModelServer is not a kind check knows, so it cannot build the pods that kind's controller makes; decide "
        "those pods themselves (their manifests, or kubectl get pods -o yaml of running ones)")
    assert isinstance(runner, Problem) and "spec.worker.gpu (amd.com/gpu: 2)" in runner.message
    assert isinstance(misplaced, Problem) and misplaced.message.endswith(
        "PyTorchJob's controller puts no such field into a pod")


def custom(spec: dict[str, Any], kind: str = "Thing", group: str = "example.com") -> Any:
    return pod_templates(Document("f.yaml", 0, {"apiVersion": f"{group}/v1", "kind": kind,
                                                "metadata": {"name": "t"}, "spec": spec}))


@pytest.mark.parametrize("spec", [
    {"accelerator": {"resourceName": "habana.ai/gaudi", "count": 8}},
    {"limits": {"gpu.intel.com/i915": "1"}},
    {"limits": {"nvidia.com/mig-1g.10gb": 1}},
    {"annotations": {"gpu-fraction": "0.5"}},  # KAI's share, wherever it is written
    {"workers": [{"gpusPerNode": "2"}]},
    {"gpu_count": 1.0},
])
def test_every_form_of_ask_in_an_unknown_kind_is_found(spec: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="asks for accelerators that check did not decide"):
        custom(spec)


@pytest.mark.parametrize("spec", [
    {"gpu": 0, "numGpus": "0", "limits": {"nvidia.com/gpu": "0"}},  # zero asks for nothing
    {"nodeSelector": {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "A100"}},  # labels select nodes
    {"gpuMemoryUtilization": "0.9", "gpuType": "nvidia.com/gpu", "tensorParallelSize": 4},  # not counts
    {"enableGpu": True},
])
def test_what_is_not_an_ask_is_not_listed_next_to_what_is(spec: dict[str, Any]) -> None:
    with pytest.raises(Exception) as err:
        custom({**spec, "engine": {"resources": {"limits": {"amd.com/gpu": 1}}}})
    assert "did not decide: spec.engine.resources.limits.amd.com/gpu (amd.com/gpu: 1); Thing is not" in str(err.value)


def test_gpu_named_counts_are_read_only_in_kinds_check_does_not_know() -> None:
    """A RayCluster's rayStartParams.num-gpus tells Ray what its pod has; the pod's own resources ask."""
    data = {"spec": {"headGroupSpec": {"rayStartParams": {"num-gpus": "1"}, "template": {"spec": {
        "containers": [{"name": "ray", "image": "rayproject/ray"}]}}}}}
    assert [p for p, _ in find(data, loose=True)] == ["/spec/headGroupSpec/rayStartParams/num-gpus"]
    assert list(find(data, loose=False)) == []
    found = pod_templates(Document("f.yaml", 0, {"apiVersion": "ray.io/v1", "kind": "RayCluster",
                                                 "metadata": {"name": "r"}, **data}))
    assert isinstance(found, list) and [w.role for w in found] == ["head"]


def test_asks_inside_a_walked_template_are_decided_with_it_and_only_those() -> None:
    template = {"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    with pytest.raises(Exception) as err:
        custom({"replicas": 2, "template": template, "gpus": 2})
    assert "did not decide: spec.gpus (gpus: 2); Thing is not" in str(err.value)


def test_capacity_kinds_and_kubernetes_own_kinds_are_exempt_but_other_k8s_io_groups_are_not() -> None:
    for kind, spec in (("ResourceQuota", {"hard": {"requests.nvidia.com/gpu": "8", "nvidia.com/gpu": "8"}}),
                       ("LimitRange", {"limits": [{"max": {"nvidia.com/gpu": 4}}]})):
        found = pod_templates(Document("f.yaml", 0, {"apiVersion": "v1", "kind": kind, "metadata": {"name": "q"},
                                                     "spec": spec}))
        assert isinstance(found, Skipped), kind
    assert isinstance(custom({"capability": {"nvidia.com/gpu": 16}}, "Queue", "scheduling.volcano.sh"), Skipped)
    with pytest.raises(Exception, match="SparkConnect is not a kind check knows"):
        custom({"executor": {"gpu": {"name": "nvidia.com/gpu", "quantity": 1}}}, "SparkConnect",
               "sparkoperator.k8s.io")


def test_check_exits_2_on_an_undecided_ask_in_every_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("apiVersion: example.com/v1\nkind: ModelServer\nmetadata: {name: m, namespace: team-a}\n"
                    "spec: {resources: {limits: {nvidia.com/gpu: 1}}}\n")
    assert main(["check", str(path)]) == 2
    assert "ERROR  ModelServer team-a/m: field spec.resources.limits.nvidia.com/gpu: asks for accelerators" in (
        capsys.readouterr().out)
    assert main(["check", "-o", "json", str(path)]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["summary"] == {"allowed": 0, "denied": 0, "skipped": 0, "errors": 1}
    assert report["results"][0]["field"] == "spec.resources.limits.nvidia.com/gpu"
