"""`gpu-admission check`: exit codes, the three output formats, input errors, ordering across workloads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest

from webhook.cli import main

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "tests" / "fixtures" / "manifests"

CLUSTER = textwrap.dedent("""
    apiVersion: v1
    kind: List
    items:
    - apiVersion: v1
      kind: Node
      metadata:
        name: gpu-1
        labels: {nvidia.com/gpu.product: NVIDIA-L4, nvidia.com/gpu.memory: "23034", nvidia.com/gpu.count: "2"}
      status:
        allocatable: {cpu: "32", memory: 128Gi, nvidia.com/gpu: "2"}
    - apiVersion: v1
      kind: Namespace
      metadata: {name: ml, labels: {gpu-admission.io/enabled: "true"}}
    - apiVersion: v1
      kind: Namespace
      metadata: {name: free}
    - apiVersion: v1
      kind: ResourceQuota
      metadata: {name: gpus, namespace: ml}
      spec: {hard: {requests.nvidia.com/gpu: "2"}}
""")


def write(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


def gpu_pod(name: str, gpus: int, namespace: str = "ml") -> str:
    return textwrap.dedent(f"""
        apiVersion: v1
        kind: Pod
        metadata: {{name: {name}, namespace: {namespace}}}
        spec:
          containers:
          - name: c
            image: cuda
            resources: {{limits: {{nvidia.com/gpu: {gpus}}}}}
    """)


@pytest.fixture()
def cluster(tmp_path: Path) -> str:
    return write(tmp_path / "cluster.yaml", CLUSTER)


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_all_allowed_exits_0_and_text_names_the_node(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = write(tmp_path / "a.yaml", gpu_pod("one", 1))
    code, out, _ = run_check(capsys, "--cluster", cluster, manifest)
    assert code == 0
    assert out.splitlines()[0] == (f"ALLOW  Pod ml/one: node gpu-1, 1 GPU x 23034 MiB/100%, single  [{manifest}:0]")
    assert out.splitlines()[-1] == "1 allowed, 0 denied, 0 skipped"


def test_pod_with_only_generate_name_is_decided(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = write(tmp_path / "g.yaml", gpu_pod("one", 1).replace("{name: one,", "{generateName: worker-,"))
    code, out, _ = run_check(capsys, "--cluster", cluster, "-o", "json", manifest)
    assert code == 0, out
    result = json.loads(out)["results"][0]
    assert result["allowed"] is True and result["allocation"]["node"] == "gpu-1"


def test_later_workloads_see_what_earlier_ones_took(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = write(tmp_path / "a.yaml", gpu_pod("one", 2) + "---\n" + gpu_pod("two", 1))
    code, out, _ = run_check(capsys, "--cluster", cluster, "-o", "json", manifest)
    assert code == 1
    report = json.loads(out)
    assert [r["allowed"] for r in report["results"]] == [True, False]
    assert report["results"][1]["code"] == 403
    assert report["results"][1]["message"].startswith(
        "exceeds ResourceQuota ml/gpus: requests.nvidia.com/gpu used 2, asked 1, limit 2"
    )
    assert report["summary"] == {"allowed": 1, "denied": 1, "skipped": 0, "errors": 0}


def test_json_result_shape_and_patch(tmp_path: Path, cluster: str, capsys) -> None:
    service = "---\napiVersion: v1\nkind: Service\nmetadata: {name: s}\n"
    manifest = write(tmp_path / "a.yaml", gpu_pod("one", 1) + service)
    code, out, _ = run_check(capsys, "--cluster", cluster, "-o", "json", manifest)
    assert code == 0
    first, second = json.loads(out)["results"]
    assert set(first) >= {
        "source",
        "kind",
        "name",
        "namespace",
        "managed",
        "allowed",
        "code",
        "message",
        "warnings",
        "patch",
        "allocation",
    }
    assert (first["source"], first["kind"], first["name"], first["namespace"]) == (f"{manifest}:0", "Pod", "one", "ml")
    assert first["allocation"]["node"] == "gpu-1" and first["allocation"]["gpuCount"] == 1
    assert {
        "op": "add",
        "path": "/spec/tolerations",
        "value": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    } in first["patch"]
    assert second["skipped"] is True and second["kind"] == "Service"


def test_workload_replicas_count_against_quota(tmp_path: Path, cluster: str, capsys) -> None:
    deployment = """
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: web, namespace: ml}
        spec:
          replicas: 3
          selector: {matchLabels: {app: web}}
          template:
            metadata: {labels: {app: web}}
            spec:
              containers:
              - {name: c, image: cuda, resources: {limits: {nvidia.com/gpu: 1}}}
    """
    code, out, _ = run_check(capsys, "--cluster", cluster, "-o", "json", write(tmp_path / "d.yaml", deployment))
    result = json.loads(out)["results"][0]
    assert code == 1 and result["replicas"] == 3
    assert result["message"].startswith("pod 3 of 3: exceeds ResourceQuota ml/gpus")


def test_unmanaged_namespace_is_reported_as_not_managed(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = write(tmp_path / "a.yaml", gpu_pod("x", 9, "free"))
    code, out, _ = run_check(capsys, "--cluster", cluster, "-o", "json", manifest)
    result = json.loads(out)["results"][0]
    assert code == 0 and result["managed"] is False and result["patch"] == []


def test_junit_has_one_case_per_workload_with_failures(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = write(tmp_path / "a.yaml", gpu_pod("ok", 1) + "---\n" + gpu_pod("big", 4))
    code, out, _ = run_check(capsys, "--cluster", cluster, "-o", "junit", manifest)
    suite = ElementTree.fromstring(out.split("\n", 1)[1])
    assert code == 1
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["Pod ml/ok", "Pod ml/big"]
    assert cases[1].find("failure").get("type") == "too-many-gpus"


def test_verbose_text_shows_the_patch(tmp_path: Path, cluster: str, capsys) -> None:
    code, out, _ = run_check(capsys, "--cluster", cluster, "-v", write(tmp_path / "a.yaml", gpu_pod("one", 1)))
    assert code == 0 and '"op": "add", "path": "/spec/tolerations"' in out


def test_stdin_is_read_with_dash(cluster: str, capsys, monkeypatch) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(gpu_pod("s", 1)))
    code, out, _ = run_check(capsys, "--cluster", cluster, "-")
    assert code == 0 and "Pod ml/s" in out


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"m.yaml": "a: [1, 2\n"}, "line 2, column 1: invalid YAML: expected ',' or ']', but got '<stream end>'"),
        ({"m.yaml": "- just\n- a list\n"}, "expected a Kubernetes object (a mapping), got a list"),
    ],
)
def test_bad_manifests_exit_2_with_file_and_document(tmp_path: Path, cluster: str, capsys, files, message) -> None:
    """A broken document is a result of its own (source, message), and the good file next to it is decided."""
    paths = [write(tmp_path / name, text) for name, text in files.items()]
    good = write(tmp_path / "z.yaml", gpu_pod("fine", 1))
    code, out, err = run_check(capsys, "--cluster", cluster, *paths, good)
    assert code == 2 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"ERROR  {message}  [{paths[0]}:0]"
    assert lines[1].startswith("ALLOW  Pod ml/fine: node gpu-1")
    assert lines[-1] == "1 allowed, 0 denied, 1 input error, 0 skipped"
    assert "Traceback" not in out


def test_missing_file_exits_2_and_the_other_files_are_still_decided(tmp_path: Path, cluster: str, capsys) -> None:
    missing = str(tmp_path / "nope.yaml")
    good = write(tmp_path / "a.yaml", gpu_pod("fine", 1))
    code, out, _ = run_check(capsys, "--cluster", cluster, "-o", "json", missing, good)
    report = json.loads(out)
    assert code == 2
    first, second = report["results"]
    assert (first["source"], first["error"], first["message"], first["field"]) == (
        missing,
        True,
        "no such file or directory",
        "",
    )
    assert second["allowed"] is True and second["name"] == "fine"
    assert report["summary"] == {"allowed": 1, "denied": 0, "skipped": 0, "errors": 1}


def test_bad_policy_names_file_and_field(tmp_path: Path, cluster: str, capsys) -> None:
    policy = write(tmp_path / "policy.yaml", "defaults:\n  placement: densest\n")
    manifest = write(tmp_path / "a.yaml", gpu_pod("a", 1))
    code, _, err = run_check(capsys, "--cluster", cluster, "--policy", policy, manifest)
    assert code == 2
    assert f"{policy}: document 0: field defaults.placement: expected one of random, best-fit" in err


def test_bad_cluster_inventory_names_the_field(tmp_path: Path, capsys) -> None:
    bad = write(
        tmp_path / "c.yaml",
        """
        apiVersion: gpu-admission.io/v1alpha1
        kind: GPUInventory
        metadata: {name: n1}
        spec: {version: 1, gpus: [{index: 0, uuid: GPU-1, model: X, memoryMiB: -5, numa: 0, healthy: true}],
               nvlink: [[0]], pcie: [[X]]}
    """,
    )
    code, _, err = run_check(capsys, "--cluster", bad, write(tmp_path / "a.yaml", gpu_pod("a", 1)))
    assert code == 2 and "c.yaml" in err and "memoryMiB" in err and "Traceback" not in err


def test_fixture_manifests_all_decide_without_error(capsys) -> None:
    code, out, err = run_check(capsys, "-n", "team-a", "-o", "json", str(MANIFESTS))
    report = json.loads(out)
    assert code == 1 and err == ""
    kinds = {r["kind"] for r in report["results"]}
    assert {"Pod", "Deployment", "StatefulSet", "Job", "CronJob", "DaemonSet"} <= kinds
    assert report["summary"]["skipped"] >= 5


def test_readme_first_command_runs_from_an_installed_copy(tmp_path: Path) -> None:
    """The README's first line, with the install into a throw-away target instead of site-packages."""
    first = (ROOT / "README.md").read_text().split("```sh\n", 1)[1].splitlines()[0]
    assert first == "pip install . && gpu-admission check examples/"
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from webhook.cli import main; sys.exit(main())", "check", "examples/"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[-1].endswith("skipped") and any(line.startswith("ALLOW") for line in lines)
    assert any(line.startswith("DENY") for line in lines)
