"""`gpu-admission check` on workload kinds: roles and pod counts in every output format, input errors as
results of their own next to the decisions of the other documents, exit codes, labels on the decided pods."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from webhook.cli import main
from webhook.commands.check import DEMO_BANNER
from webhook.core.admission import admit

ROOT = Path(__file__).resolve().parents[2]
WRITTEN = ROOT / "tests" / "fixtures" / "workloads" / "written"
PUBLIC = ROOT / "tests" / "fixtures" / "workloads" / "public"


def cluster_text(quota: int) -> str:
    nodes = "".join(
        textwrap.dedent(f"""
        - apiVersion: v1
          kind: Node
          metadata:
            name: h100-{i}
            labels: {{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, nvidia.com/gpu.memory: "81559",
                     nvidia.com/gpu.count: "8"}}
          status:
            allocatable: {{cpu: "200", memory: 2000Gi, nvidia.com/gpu: "8"}}
    """)
        for i in range(4)
    )
    return (
        "apiVersion: v1\nkind: List\nitems:\n"
        + nodes
        + textwrap.dedent(f"""
        - apiVersion: v1
          kind: Namespace
          metadata: {{name: ml, labels: {{gpu-admission.io/enabled: "true"}}}}
        - apiVersion: v1
          kind: Namespace
          metadata: {{name: kube-system, labels: {{gpu-admission.io/enabled: "true"}}}}
        - apiVersion: v1
          kind: ResourceQuota
          metadata: {{name: gpus, namespace: ml}}
          spec: {{hard: {{requests.nvidia.com/gpu: "{quota}"}}}}
    """)
    )


@pytest.fixture()
def cluster(tmp_path: Path) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(cluster_text(32))
    return str(path)


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    assert err == ""
    return code, out


def by_line(out: str) -> list[str]:
    return [line.split("  [")[0] for line in out.splitlines() if not line.startswith("       ")]


def test_pytorchjob_roles_and_counts_in_text(cluster: str, capsys) -> None:
    code, out = check(capsys, "--cluster", cluster, str(WRITTEN / "pytorchjob-train.yaml"))
    lines = by_line(out)
    assert code == 0
    assert lines[0].startswith("ALLOW  PyTorchJob ml/train: Master: node h100-")
    assert lines[1].startswith("ALLOW  PyTorchJob ml/train: Worker x4: 4 pods admitted; nodes h100-")
    assert lines[-1] == "2 allowed, 0 denied, 0 skipped"


def test_each_role_sees_what_the_earlier_roles_took(tmp_path: Path, capsys) -> None:
    small = tmp_path / "c.yaml"
    small.write_text(cluster_text(4))
    code, out = check(capsys, "--cluster", str(small), "-o", "json", str(WRITTEN / "pytorchjob-train.yaml"))
    master, worker = json.loads(out)["results"]
    assert code == 1
    assert (master["role"], master["allowed"], worker["role"], worker["replicas"]) == ("Master", True, "Worker", 4)
    assert worker["message"].startswith("pod 4 of 4: exceeds ResourceQuota ml/gpus: requests.nvidia.com/gpu used 4")


def test_volcano_job_is_decided_not_an_abort(cluster: str, capsys) -> None:
    """A Volcano Job used to stop the whole run with exit 2 and no output; now its tasks are decided."""
    code, out = check(capsys, "--cluster", cluster, "-o", "json", str(WRITTEN / "volcano-job-gpu.yaml"))
    report = json.loads(out)
    assert code == 0
    assert [(r["kind"], r["group"], r["name"], r["role"], r["replicas"]) for r in report["results"]] == [
        ("Job", "batch.volcano.sh", "tf-dist", "ps", 1),
        ("Job", "batch.volcano.sh", "tf-dist", "worker", 3),
        ("Job", "batch", "eval", "", 2),
    ]
    assert report["results"][1]["allocation"]["gpuCount"] == 2


MIXED = str(WRITTEN / "mixed-good-and-broken.yaml")


def test_mixed_file_text(cluster: str, capsys) -> None:
    code, out = check(capsys, "--cluster", cluster, MIXED)
    assert code == 2
    assert by_line(out) == [
        "ALLOW  Pod ml/ok: node h100-0, 1 GPU x 81559 MiB/100%, single",
        "ERROR  Deployment ml/bad-count: field spec.replicas: expected a whole number >= 0, got 'three'",
        "ERROR  line 31, column 1: invalid YAML: expected ',' or ']', but got '<stream end>'",
        "ERROR  TrainJob ml/orphan: field spec.runtimeRef: cannot decide: its pods come from ClusterTrainingRuntime "
        "not-given, which is not in the input; pass that runtime's manifest too (its pod templates are in "
        "spec.template.spec.replicatedJobs)",
        "SKIP   Service ml/svc: Service runs no pods",
        "SKIP   Namespace ml: Namespace runs no pods",
        "ALLOW  Job (batch.volcano.sh) ml/vc: worker: node h100-0, 1 GPU x 81559 MiB/100%, single",
        "2 allowed, 0 denied, 3 input errors, 2 skipped",
    ]
    assert f"[{MIXED}:2]" in out.splitlines()[2]


def test_mixed_file_json(cluster: str, capsys) -> None:
    code, out = check(capsys, "--cluster", cluster, "-o", "json", MIXED)
    report = json.loads(out)
    assert code == 2
    assert report["summary"] == {"allowed": 2, "denied": 0, "skipped": 2, "errors": 3}
    errors = [(r["source"], r["kind"], r["field"], r["reason"]) for r in report["results"] if r["error"]]
    assert errors == [
        (f"{MIXED}:1", "Deployment", "spec.replicas", "input-error"),
        (f"{MIXED}:2", "", "", "input-error"),
        (f"{MIXED}:3", "TrainJob", "spec.runtimeRef", "input-error"),
    ]
    namespace = next(r for r in report["results"] if r["kind"] == "Namespace")
    assert (namespace["namespace"], namespace["managed"]) == ("", False)  # cluster-scoped: no -n namespace


def test_mixed_file_junit(cluster: str, capsys) -> None:
    code, out = check(capsys, "--cluster", cluster, "-o", "junit", MIXED)
    suite = ElementTree.fromstring(out.split("\n", 1)[1])
    assert code == 2
    counts = (suite.get("tests"), suite.get("errors"), suite.get("failures"), suite.get("skipped"))
    assert counts == ("7", "3", "0", "2")
    errors = [
        (c.get("name"), c.find("error").get("type"), c.find("error").text)
        for c in suite.findall("testcase")
        if c.find("error") is not None
    ]
    assert errors[0] == (
        "Deployment ml/bad-count",
        "input-error",
        "field spec.replicas: expected a whole number >= 0, got 'three'",
    )
    assert errors[1][0] == f"{MIXED}:2" and errors[2][0] == "TrainJob ml/orphan"


def test_a_gpu_workload_of_an_unknown_kind_is_found_by_walking_and_denied(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = tmp_path / "crd.yaml"
    manifest.write_text(
        textwrap.dedent("""
        apiVersion: serving.example.com/v1
        kind: ModelServer
        metadata: {name: huge, namespace: ml}
        spec:
          engine:
            template:
              spec:
                containers:
                - {name: c, image: vllm, resources: {limits: {nvidia.com/gpu: 16}}}
    """)
    )
    code, out = check(capsys, "--cluster", cluster, "-o", "json", str(manifest))
    [result] = json.loads(out)["results"]
    assert code == 1
    assert (result["foundBy"], result["role"], result["reason"]) == ("walking", "spec.engine.template", "too-many-gpus")
    assert result["notes"] == ["found by walking: ModelServer is not a kind check knows; decided as 1 pod"]


def test_kube_system_is_never_managed_even_when_labelled(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = tmp_path / "ks.yaml"
    manifest.write_text(
        textwrap.dedent("""
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: idle, namespace: kube-system}
        spec:
          replicas: 0
          template:
            spec:
              containers: [{name: c, image: cuda, resources: {limits: {nvidia.com/gpu: 1}}}]
        ---
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: cm, namespace: kube-system}
    """)
    )
    code, out = check(capsys, "--cluster", cluster, "-o", "json", str(manifest))
    results = json.loads(out)["results"]
    assert code == 0
    assert [(r["kind"], r["namespace"], r["managed"]) for r in results] == [
        ("Deployment", "kube-system", False),
        ("ConfigMap", "kube-system", False),
    ]


def test_zero_replicas_still_decides_one_pod_uncounted(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = tmp_path / "z.yaml"
    manifest.write_text(
        textwrap.dedent("""
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: later, namespace: ml}
        spec:
          replicas: 0
          template:
            spec:
              containers: [{name: c, image: cuda, resources: {limits: {nvidia.com/gpu: 16}}}]
    """)
    )
    code, out = check(capsys, "--cluster", cluster, "-o", "json", str(manifest))
    [result] = json.loads(out)["results"]
    assert code == 1 and result["replicas"] == 0
    assert result["message"].startswith("0 pods now; one pod of it: asks for 16 GPUs in one pod")


def test_trainjob_and_its_runtime_decided_together(cluster: str, capsys) -> None:
    code, out = check(capsys, "--cluster", cluster, "-o", "json", str(WRITTEN / "trainjob-with-runtime.yaml"))
    results = json.loads(out)["results"]
    assert code == 0
    assert [(r["kind"], r["role"], r["replicas"], r["skipped"]) for r in results] == [
        ("ClusterTrainingRuntime", "", 0, True),
        ("TrainJob", "model-initializer", 1, False),
        ("TrainJob", "node", 3, False),
    ]
    assert results[0]["namespace"] == "" and results[2]["allocation"]["gpuCount"] == 2


def test_decided_pods_carry_their_controllers_labels(cluster: str, capsys, monkeypatch) -> None:
    seen: list[dict[str, Any]] = []
    real = admit.mutate

    def spy(pod: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(dict(pod["metadata"]))
        return real(pod, *args, **kwargs)

    monkeypatch.setattr(admit, "mutate", spy)
    code, _ = check(
        capsys, "--cluster", cluster, str(WRITTEN / "pytorchjob-train.yaml"), str(WRITTEN / "kserve-model-and-lws.yaml")
    )
    assert code == 0
    workers = [m for m in seen if m["labels"].get("training.kubeflow.org/replica-type") == "worker"]
    assert [m["labels"]["training.kubeflow.org/replica-index"] for m in workers] == ["0", "1", "2", "3"]
    assert {m["name"] for m in workers} == {"train-worker-0", "train-worker-1", "train-worker-2", "train-worker-3"}
    lws = "leaderworkerset.sigs.k8s.io/"
    mesh = [
        (m["labels"][lws + "group-index"], m["labels"][lws + "worker-index"])
        for m in seen
        if m["labels"].get(lws + "name") == "mesh"
    ]
    assert mesh == [("0", "0"), ("0", "1"), ("0", "2"), ("1", "0"), ("1", "1"), ("1", "2")]
    predictor = next(m for m in seen if m["labels"].get("component") == "predictor")
    assert predictor["labels"]["serving.kserve.io/inferenceservice"] == "llama"


def test_public_workloads_are_all_looked_at(capsys) -> None:
    """Against the demo cluster: nothing that runs pods is skipped, and the TrainJob whose runtime is not
    given keeps the run from passing (exit 2) while everything else is still decided."""
    code, out = check(capsys, "-n", "team-a", "-o", "json", str(PUBLIC))
    report = json.loads(out)
    assert code == 2
    assert report["summary"]["errors"] == 1
    assert {r["kind"] for r in report["results"] if r["skipped"]} == {
        "ConfigMap",
        "Secret",
        "Service",
        "ClusterTrainingRuntime",
        "NIMCache",
    }
    decided = [r for r in report["results"] if not r["skipped"] and not r["error"]]
    assert len(decided) == 72 and sum(r["replicas"] for r in decided) == 106  # as test_workloads.py lists


def test_demo_banner_only_in_text_against_the_embedded_cluster(cluster: str, capsys) -> None:
    example = str(ROOT / "examples" / "01-single-gpu.yaml")
    code, out = check(capsys, example)
    # Admitted: the banner names the demo cluster, and does not say exit 1 is expected.
    assert code == 0 and out.splitlines()[0].startswith("Deciding against the embedded demo cluster")
    assert "exit code 1" not in out
    assert "embedded demo cluster" in DEMO_BANNER and "exit code 1 is expected" in DEMO_BANNER
    _, out = check(capsys, "-o", "json", example)
    assert json.loads(out)["results"][0]["allowed"] is True
    _, out = check(capsys, "-o", "junit", example)
    assert out.startswith("<?xml")
    _, out = check(capsys, "--cluster", cluster, example)
    assert DEMO_BANNER not in out


def test_a_pod_the_core_fails_on_is_an_error_result_not_a_crash(cluster: str, capsys, monkeypatch) -> None:
    real = admit.mutate

    def choke(pod: Any, *args: Any, **kwargs: Any) -> Any:
        if pod["metadata"]["labels"].get("training.kubeflow.org/replica-type") == "master":
            raise TypeError("unhashable type: 'dict'")
        return real(pod, *args, **kwargs)

    monkeypatch.setattr(admit, "mutate", choke)
    code, out = check(capsys, "--cluster", cluster, "-o", "json", str(WRITTEN / "pytorchjob-train.yaml"))
    master, worker = json.loads(out)["results"]
    assert code == 2
    assert (master["error"], master["field"], master["message"]) == (
        True,
        "spec.pytorchReplicaSpecs.Master.template",
        "could not be decided: internal error (TypeError: unhashable type: 'dict')",
    )
    assert worker["allowed"] is True and worker["replicas"] == 4
