"""Argo steps decided as the pods Argo's controller creates (argo-workflows workflow/controller/workflowpod.go):
`init` then the template's init containers; `wait` first, then `main` (or a containerSet's containers),
then sidecars; podSpecPatch applied; parameters the manifest states filled in. And the KAI share that an
unnamed gpu-fraction would give Argo's `wait` container instead of the step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from webhook.core.podspec.kai import fraction_container
from webhook.core.podspec.resources import parse_pod
from webhook.errors import UserError
from webhook.manifests import Document, read_all
from webhook.workloads import Workload, pod_templates, workloads

FIXTURES = Path(__file__).parent.parent / "fixtures" / "workloads"
PUBLIC, WRITTEN = FIXTURES / "public", FIXTURES / "written"


def names(workload: Workload, key: str = "containers") -> list[str]:
    return [c["name"] for c in workload.pod["spec"].get(key, [])]


def limits(workload: Workload) -> dict[str, Any]:
    return {c["name"]: (c.get("resources") or {}).get("limits") for c in workload.pod["spec"]["containers"]}


def written() -> dict[str, Workload]:
    found = workloads(read_all([str(WRITTEN / "argo-gpu-pods.yaml")]))
    assert all(isinstance(w, Workload) for w in found)
    return {w.role: w for w in found if isinstance(w, Workload)}


def test_the_pod_has_argos_executor_containers_around_the_step() -> None:
    pods = written()
    assert [(role, names(w, "initContainers"), names(w)) for role, w in pods.items()] == [
        ("train", ["init"], ["wait", "main"]),
        ("pair", ["init"], ["wait", "fetch", "infer"]),  # a containerSet keeps its containers' names
        ("serve", ["init", "warm"], ["wait", "main", "metrics"]),
        ("probe", ["init"], ["wait", "main"]),
    ]
    serve = pods["serve"]
    assert limits(serve) == {"wait": None, "main": {"nvidia.com/gpu": 2}, "metrics": None}
    assert serve.pod["metadata"]["annotations"] == {"workflows.argoproj.io/node-name": "gpu-pods-.serve",
                                                    "kubectl.kubernetes.io/default-container": "main"}
    assert pods["pair"].pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "infer"
    assert {"name": "var-run-argo", "emptyDir": {}} in serve.pod["spec"]["volumes"]


def test_pod_spec_patch_gives_main_the_gpus_of_the_workflow_parameter() -> None:
    train = written()["train"]
    assert limits(train) == {"wait": None, "main": {"nvidia.com/gpu": "4"}}
    assert parse_pod(train.pod).gpus == 4
    assert train.notes[-1] == ("Argo parameters filled in with the values the manifest states "
                               "(a step's arguments may differ)")


def test_public_pod_spec_patches_of_the_workflow_and_the_template_both_apply() -> None:
    [pod] = workloads(read_all([str(PUBLIC / "argo-workflows-examples-pod-spec-patch-wf-tmpl.yaml")]))
    assert isinstance(pod, Workload)
    assert limits(pod)["main"] == {"memory": "100Mi", "cpu": "100m"}


def workflow(template: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "w"},
            "spec": {"templates": [{"name": "t", "container": {"image": "i"}, **template}], **spec}}


def test_script_source_is_staged_by_init_and_run_by_main() -> None:
    [pod] = pod_templates(Document("f.yaml", 0, workflow({"container": None, "script": {
        "image": "python:3.12", "command": ["python"], "source": "print(1)"}})))
    assert pod.pod["spec"]["containers"][1] == {
        "image": "python:3.12", "command": ["python"], "name": "main", "args": ["/argo/staging/script"],
        "env": [{"name": "ARGO_CONTAINER_NAME", "value": "main"}],
        "volumeMounts": [{"name": "var-run-argo", "mountPath": "/var/run/argo"}]}


def test_a_gpu_parameter_without_a_value_in_the_manifest_is_an_input_error() -> None:
    patch = '{"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "{{inputs.parameters.n}}"}}}]}'
    with pytest.raises(UserError, match=r"field spec.templates\[0\].podSpecPatch: cannot apply it: "
                                        r"\{\{inputs.parameters.n\}\} is a parameter the manifest gives no value"):
        pod_templates(Document("f.yaml", 0, workflow({"podSpecPatch": patch})))
    with_default = {"podSpecPatch": patch, "inputs": {"parameters": [{"name": "n", "default": "2"}]}}
    [pod] = pod_templates(Document("f.yaml", 0, workflow(with_default)))
    assert parse_pod(pod.pod).gpus == 2
    with pytest.raises(UserError, match="podSpecPatch: cannot apply it: invalid JSON or YAML"):
        pod_templates(Document("f.yaml", 0, workflow({"podSpecPatch": "{containers: ["})))


def test_template_resources_from_a_stated_parameter_are_filled_in() -> None:
    [pod] = pod_templates(Document("f.yaml", 0, workflow(
        {"container": {"image": "i", "resources": {"limits": {"nvidia.com/gpu": "{{workflow.parameters.g}}"}}}},
        arguments={"parameters": [{"name": "g", "value": 3}]})))
    assert parse_pod(pod.pod).gpus == 3


def containers_of(workload: Workload) -> list[tuple[str, bool]]:
    spec = workload.pod["spec"]
    return [(c["name"], False) for c in spec["containers"]] + [(c["name"], True) for c in spec["initContainers"]]


def test_an_unnamed_kai_share_in_an_argo_pod_would_reach_wait_and_is_refused() -> None:
    """KAI gives an unnamed gpu-fraction to spec.containers[0] (pkg/binder/common/gpu_access.go,
    GetFractionContainerRef), which Argo makes `wait`: the step would run without a GPU."""
    [pod] = pod_templates(Document("f.yaml", 0, workflow({"metadata": {"annotations": {"gpu-fraction": "0.5"}},
                                                          "schedulerName": "kai-scheduler"})))
    assert names(pod)[0] == "wait"
    target = fraction_container(containers_of(pod), pod.pod["metadata"]["annotations"])
    assert target.position is None and target.problem == (
        "annotations gpu-fraction/gpu-memory give the share to the pod's first container, which Argo makes its "
        "'wait' executor, so the step ('main') would get no GPU; add gpu-fraction-container-name: main to the "
        "template's metadata.annotations")
    named = written()["probe"]  # the written step names main, as the message asks
    assert fraction_container(containers_of(named), named.pod["metadata"]["annotations"]) == (1, None)
