"""Manifests -> documents -> pod templates: every real-world fixture, every workload kind, every error."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from webhook.core.podspec.resources import parse_pod
from webhook.errors import UserError
from webhook.manifests import Document, load_documents, parse_text
from webhook.workloads import Skipped, Workload, pod_templates, workloads

FIXTURES = Path(__file__).parent.parent / "fixtures" / "manifests"

# file -> per document: ("skip", kind) or (kind, name, namespace, replicas, per_node,
#          (vendor, gpus, memory_mib, memory_pct, cores, is_gpu_pod, violation rules))
EXPECTED: dict[str, list[tuple[object, ...]]] = {
    "gateway-api-inference-extension-config-manifests-vllm-gpu-deployment.yaml": [
        ("Deployment", "vllm-qwen3-32b", None, 3, False, ("nvidia", 1, None, None, None, True, ()))
    ],
    "gke-samples-demos-vit-training-example-spec-gcs.yaml": [
        (
            "StatefulSet",
            "tensorflow",
            "example",
            1,
            False,
            ("nvidia", 1, None, None, None, True, ("isolation-privileged",)),
        ),
        ("skip", "Service"),
        ("skip", "Service"),
    ],
    "hami-examples-hygon-default_use.yaml": [
        ("Pod", "vdcu-pytorch-demo", None, 1, False, ("hygon", 1, 2000, None, 60, True, ()))
    ],
    "hami-examples-hygon-specify_card_type_to_use.yaml": [
        ("Pod", "vdcu-pytorch-demo", None, 1, False, ("hygon", 1, 2000, None, 60, True, ()))
    ],
    "hami-examples-mlu-default_use.yaml": [
        ("Deployment", "binpack-1", None, 1, False, ("cambricon", 1, 5120, None, 10, True, ()))
    ],
    "hami-examples-nvidia-default_use.yaml": [
        ("Pod", "gpu-pod", None, 1, False, ("nvidia", 1, 3000, None, 30, True, ()))
    ],
    "hami-examples-nvidia-dynamic_mig_example.yaml": [
        ("Pod", "gpu-pod", None, 1, False, ("nvidia", 2, 8000, None, None, True, ()))
    ],
    "hami-examples-nvidia-example.yaml": [
        ("Deployment", "cuda-sample-vector-add", None, 1, False, ("nvidia", 1, 3000, None, None, True, ()))
    ],
    "hami-examples-nvidia-mig_example.yaml": [
        ("Pod", "gpu-pod", None, 1, False, ("nvidia", 1, None, None, None, True, ()))
    ],
    "hami-examples-nvidia-specify_card_type_not_use.yaml": [
        ("Pod", "gpu-pod", None, 1, False, ("nvidia", 2, None, None, None, True, ()))
    ],
    "hami-examples-nvidia-specify_card_type_to_use.yaml": [
        ("Pod", "gpu-pod", None, 1, False, ("nvidia", 2, None, None, None, True, ()))
    ],
    "hami-examples-nvidia-specify_scheduling_policy.yaml": [
        ("Pod", "gpu-pod", None, 1, False, ("nvidia", 1, None, None, None, True, ()))
    ],
    "hami-examples-nvidia-specify_uuid_to_use.yaml": [
        ("Pod", "gpu-pod", None, 1, False, ("nvidia", 1, None, None, None, True, ()))
    ],
    "hami-examples-nvidia-use_memory_fraction.yaml": [
        ("Pod", "gpu-pod", None, 1, False, ("nvidia", 2, None, 50, 30, True, ()))
    ],
    "hami-examples-nvidia-use_sharing_card.yaml": [
        ("Pod", "gpu-pod1", None, 1, False, ("nvidia", 1, None, 40, 60, True, ())),
        ("Pod", "gpu-pod2", None, 1, False, ("nvidia", 1, None, 60, 40, True, ())),
    ],
    "hami-examples-nvidia-vllm_cross_vgpu.yaml": [
        ("skip", "PersistentVolumeClaim"),
        ("Deployment", "vllm-cross-vgpu", None, 1, False, ("nvidia", 2, None, 30, 30, True, ())),
    ],
    "ibm-autopilot-utility-tools-cronjobs-pcie-cronjob.yaml": [
        ("CronJob", "pcie-bw-cronjob", None, 9, False, ("nvidia", 8, None, None, None, True, ()))
    ],
    "kai-scheduler-docs-batch-batch-job.yaml": [
        ("Job", "batch-job", None, 2, False, ("nvidia", 1, None, None, None, True, ()))
    ],
    "kai-scheduler-docs-gpu-sharing-gpu-memory.yaml": [
        ("Pod", "gpu-sharing", None, 1, False, ("nvidia", 1, 2000, None, None, True, ()))
    ],
    "kai-scheduler-docs-gpu-sharing-gpu-sharing.yaml": [
        # a memory share, no compute cap
        ("Pod", "gpu-sharing", None, 1, False, ("nvidia", 1, None, 50, None, True, ()))
    ],
    "kai-scheduler-docs-gpu-sharing-mps-gpu-sharing-with-mps.yaml": [
        # a memory share, no compute cap
        ("Pod", "gpu-sharing-with-mps", None, 1, False, ("nvidia", 1, None, 50, None, True, ()))
    ],
    "kueue-site-examples-dra-sample-dra-extended-resource-job.yaml": [
        ("Job", "sample-dra-extended-job-", "default", 1, False, ("", 0, None, None, None, False, ()))
    ],
    "kueue-site-examples-provisioning-sample-job.yaml": [
        ("Job", "sample-job-", "default", 3, False, ("nvidia", 1, None, None, None, True, ()))
    ],
    "kueue-site-examples-serving-workloads-sample-hami.yaml": [
        ("skip", "ResourceFlavor"),
        ("skip", "ClusterQueue"),
        ("skip", "Namespace"),
        ("skip", "LocalQueue"),
        ("Deployment", "gpu-burn", "kueue-test", 1, False, ("nvidia", 2, 1024, None, 30, True, ())),
    ],
    "nvidia-gpu-operator-tests-gpu-pod.yaml": [
        ("Pod", "gpu-operator-test", None, 1, False, ("nvidia", 1, None, None, None, True, ()))
    ],
    "nvidia-gpu-operator-tests-plugin-test-time-slicing.yaml": [
        ("Deployment", "nvidia-plugin-test", None, 5, False, ("nvidia", 1, None, None, None, True, ()))
    ],
    "nvidia-k8s-device-plugin-deployments-static-nvidia-device-plugin.yml": [
        (
            "DaemonSet",
            "nvidia-device-plugin-daemonset",
            "kube-system",
            1,
            True,
            ("", 0, None, None, None, False, ()),
        )
    ],
    "nvidia-k8s-device-plugin-testdata-job-1.yaml": [
        ("Job", "j-e2e-1", None, 1, False, ("nvidia", 1, None, None, None, True, ()))
    ],
    "volcano-vgpu-device-plugin-examples-vgpu-case03.yml": [
        ("Pod", "gpu-pod12", None, 1, False, ("nvidia", 4, 3000, None, None, True, ()))
    ],
    "volcano-vgpu-device-plugin-examples-vgpu-deployment.yaml": [
        ("Deployment", "resnet101-deployment", None, 10, False, ("nvidia", 1, 16384, None, None, True, ()))
    ],
}


def test_every_fixture_is_covered() -> None:
    on_disk = sorted(p.name for p in FIXTURES.iterdir() if p.suffix in (".yaml", ".yml"))
    assert on_disk == sorted(EXPECTED)
    assert len(on_disk) == 30


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_loads_and_parses(name: str) -> None:
    path = str(FIXTURES / name)
    results = workloads(load_documents([path]))
    assert len(results) == len(EXPECTED[name])
    for index, (result, expected) in enumerate(zip(results, EXPECTED[name], strict=True)):
        assert result.source == f"{path}:{index}"
        if expected[0] == "skip":
            assert isinstance(result, Skipped)
            assert result.kind == expected[1]
            continue
        kind, workload_name, namespace, replicas, per_node, request_values = expected
        assert isinstance(result, Workload)
        assert (result.kind, result.name, result.namespace, result.replicas, result.per_node) == (
            kind,
            workload_name,
            namespace,
            replicas,
            per_node,
        )
        request = parse_pod(result.pod)
        assert (
            request.vendor,
            request.gpus,
            request.memory_mib,
            request.memory_pct,
            request.cores,
            request.is_gpu_pod,
            tuple(v.rule for v in request.violations),
        ) == request_values


def test_fixture_directory_loads_in_sorted_order() -> None:
    documents = load_documents([str(FIXTURES)])
    files = [d.file for d in documents]
    assert files == sorted(files)
    assert len(documents) == sum(len(v) for v in EXPECTED.values()) == 38


# --- documents --------------------------------------------------------------------------------


def test_multi_document_yaml_keeps_indices_of_empty_documents(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("---\n# only a comment\n---\nkind: Pod\nmetadata: {name: a}\n---\n---\nkind: Service\n")
    docs = load_documents([str(path)])
    assert [(d.index, d.data["kind"], d.source) for d in docs] == [
        (1, "Pod", f"{path}:1"),
        (3, "Service", f"{path}:3"),
    ]


def test_timestamps_stay_strings(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("kind: Pod\nmetadata:\n  creationTimestamp: 2024-05-01T10:00:00Z\n")
    assert load_documents([str(path)])[0].data["metadata"]["creationTimestamp"] == "2024-05-01T10:00:00Z"


def test_json_and_kind_list(tmp_path: Path) -> None:
    listing = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"kind": "Pod", "metadata": {"name": "a"}, "spec": {"containers": []}},
            {"kind": "Service", "metadata": {"name": "s"}},
        ],
    }
    path = tmp_path / "list.json"
    path.write_text(json.dumps(listing))
    docs = load_documents([str(path)])
    assert [(d.source, d.data["kind"]) for d in docs] == [
        (f"{path}:0.items[0]", "Pod"),
        (f"{path}:0.items[1]", "Service"),
    ]


def test_stdin() -> None:
    docs = load_documents(["-"], stdin=io.StringIO("kind: Pod\nmetadata: {name: x}\n"))
    assert [(d.file, d.index) for d in docs] == [("<stdin>", 0)]


def test_directories_are_walked_for_manifest_extensions(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / ".hidden").mkdir()
    for name in ("b.yaml", "a.yml", "sub/c.json", "notes.txt", ".hidden/d.yaml"):
        (tmp_path / name).write_text('{"kind": "Pod"}' if name.endswith(".json") else "kind: Pod\n")
    docs = load_documents([str(tmp_path)])
    assert [os.path.relpath(d.file, tmp_path) for d in docs] == ["a.yml", "b.yaml", "sub/c.json"]


@pytest.mark.parametrize(
    ("text", "name", "message"),
    [
        (
            "kind: Pod\nmetadata:\n  name: [a\n",
            "bad.yaml",
            "bad.yaml: document 0: line 4, column 1: invalid YAML: expected ',' or ']', but got '<stream end>'",
        ),
        (
            "kind: Pod\n---\nkind: Pod\n  name: x\n",
            "bad.yaml",
            "bad.yaml: document 1: line 4, column 7: invalid YAML: mapping values are not allowed here",
        ),
        ('{"kind": "Pod",\n "x": }', "bad.json", "bad.json: line 2, column 7: invalid JSON: Expecting value"),
        (
            "- a\n- b\n",
            "list.yaml",
            "list.yaml: document 0: expected a Kubernetes object (a mapping), got a list",
        ),
        (
            "kind: List\nitems: [1]\n",
            "l.yaml",
            "l.yaml: document 0: field items[0]: expected an object (a mapping)",
        ),
        ("kind: List\nitems: {}\n", "l.yaml", "l.yaml: document 0: field items: expected a list of objects"),
    ],
)
def test_bad_input_names_file_document_and_line(text: str, name: str, message: str) -> None:
    with pytest.raises(UserError) as err:
        parse_text(text, name)
    assert str(err.value) == message


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        load_documents([str(tmp_path / "missing.yaml")])
    assert str(err.value) == f"{tmp_path / 'missing.yaml'}: no such file or directory"
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError) as err:
        load_documents([str(binary)])
    assert str(err.value) == f"{binary}: not UTF-8 text (invalid start byte at byte 0)"


# --- pod templates ----------------------------------------------------------------------------

TEMPLATE = {
    "metadata": {"labels": {"app": "x"}, "annotations": {"gpu-fraction": "0.5"}},
    "spec": {"containers": [{"name": "c", "image": "i"}]},
}


def doc(data: dict[str, object]) -> Document:
    return Document("f.yaml", 2, data)


@pytest.mark.parametrize(
    ("kind", "spec", "replicas", "per_node", "pointer"),
    [
        ("Deployment", {"replicas": 4, "template": TEMPLATE}, 4, False, "/spec/template"),
        ("Deployment", {"template": TEMPLATE}, 1, False, "/spec/template"),
        ("StatefulSet", {"replicas": 0, "template": TEMPLATE}, 0, False, "/spec/template"),
        ("ReplicaSet", {"replicas": 2, "template": TEMPLATE}, 2, False, "/spec/template"),
        ("ReplicationController", {"replicas": 3, "template": TEMPLATE}, 3, False, "/spec/template"),
        ("DaemonSet", {"template": TEMPLATE}, 1, True, "/spec/template"),
        ("Job", {"template": TEMPLATE}, 1, False, "/spec/template"),
        ("Job", {"parallelism": 5, "completions": 2, "template": TEMPLATE}, 2, False, "/spec/template"),
        (
            "CronJob",
            {"jobTemplate": {"spec": {"parallelism": 4, "template": TEMPLATE}}},
            4,
            False,
            "/spec/jobTemplate/spec/template",
        ),
    ],
)
def test_workload_kinds(kind: str, spec: dict[str, object], replicas: int, per_node: bool, pointer: str) -> None:
    [result] = pod_templates(doc({"kind": kind, "metadata": {"name": "w", "namespace": "team-a"}, "spec": spec}))
    assert isinstance(result, Workload)
    assert (
        result.kind,
        result.name,
        result.namespace,
        result.replicas,
        result.per_node,
        result.template_path,
    ) == (kind, "w", "team-a", replicas, per_node, pointer)
    assert result.pod == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "labels": {"app": "x"},
            "annotations": {"gpu-fraction": "0.5"},
            "name": "w",
            "namespace": "team-a",
        },
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    assert TEMPLATE["metadata"] == {
        "labels": {"app": "x"},
        "annotations": {"gpu-fraction": "0.5"},
    }  # not mutated


def test_pod_is_copied_unchanged() -> None:
    data = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}
    [result] = pod_templates(doc(data))
    assert isinstance(result, Workload)
    assert (result.pod, result.replicas, result.template_path, result.namespace) == (data, 1, "", None)
    assert result.pod is not data


def test_other_kinds_are_skipped() -> None:
    result = pod_templates(doc({"kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "n"}}))
    assert result == Skipped("f.yaml:2", "ConfigMap", "cm", "n", "ConfigMap runs no pods")
    unnamed = pod_templates(doc({"metadata": {}}))
    assert isinstance(unnamed, Skipped) and unnamed.reason == "an object without kind runs no pods"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": "oops"}},
            "f.yaml: document 2: field spec.template: expected a mapping, got a string",
        ),
        (
            {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"replicas": 1}},
            "f.yaml: document 2: field spec.template: missing",
        ),
        (
            {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"metadata": {}}}}}},
            "f.yaml: document 2: field spec.jobTemplate.spec.template.spec: missing",
        ),
        (
            {"kind": "Deployment", "spec": {"replicas": "3", "template": TEMPLATE}},
            "f.yaml: document 2: field spec.replicas: expected a whole number >= 0, got '3'",
        ),
        (
            {"kind": "Job", "spec": {"parallelism": -1, "template": TEMPLATE}},
            "f.yaml: document 2: field spec.parallelism: expected a whole number >= 0, got -1",
        ),
        (
            {"kind": "Pod", "metadata": ["x"], "spec": {}},
            "f.yaml: document 2: field metadata: expected a mapping, got a list",
        ),
        ({"kind": "Pod", "metadata": {"name": "p"}}, "f.yaml: document 2: field spec: missing"),
    ],
)
def test_malformed_workloads(data: dict[str, object], message: str) -> None:
    with pytest.raises(UserError) as err:
        pod_templates(doc(data))
    assert str(err.value) == message


def test_list_item_errors_name_the_item() -> None:
    bad = Document("f.yaml", 0, {"kind": "Deployment", "spec": {"template": 3}}, item=5)
    with pytest.raises(UserError) as err:
        pod_templates(bad)
    assert str(err.value) == "f.yaml: document 0: field items[5].spec.template: expected a mapping, got a number"


def test_generate_name_carries_over() -> None:
    [result] = pod_templates(doc({"kind": "Job", "metadata": {"generateName": "run-"}, "spec": {"template": TEMPLATE}}))
    assert isinstance(result, Workload)
    assert result.pod["metadata"]["generateName"] == "run-"
    assert "name" not in result.pod["metadata"]
    assert parse_pod(result.pod).name == "run-"
