"""`gpu-admission check` on input that is wrong or incomplete: it never passes silently. Also the output
formats and options kubectl and conftest users expect (-o yaml, -o table, --fail-on-warn, version)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from webhook.cli import COMMANDS, main
from webhook.commands.check import BUNDLED_EXAMPLES, DEMO_BANNER, DEMO_NOTE

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

NODE = """
    apiVersion: v1
    kind: Node
    metadata:
      name: gpu-1
      labels: {nvidia.com/gpu.product: NVIDIA-L4, nvidia.com/gpu.memory: "23034", nvidia.com/gpu.count: "4"}
    status:
      allocatable: {cpu: "32", memory: 128Gi, nvidia.com/gpu: "4"}
"""
NAMESPACE = """
    apiVersion: v1
    kind: Namespace
    metadata: {name: ml, labels: {gpu-admission.io/enabled: "true"}}
"""
QUOTA = """
    apiVersion: v1
    kind: ResourceQuota
    metadata: {name: gpus, namespace: ml}
    spec: {hard: {requests.nvidia.com/gpu: "3"}}
"""
COMPOSE = """
    version: "3.8"
    services:
      web:
        image: nginx
        ports: ["80:80"]
"""


def write(path: Path, *docs: str) -> str:
    path.write_text("---\n".join(textwrap.dedent(d) for d in docs))
    return str(path)


def gpu_pod(name: str, gpus: int = 1, namespace: str | None = "ml", extra: str = "") -> str:
    ns = f", namespace: {namespace}" if namespace else ""
    return f"""
        apiVersion: v1
        kind: Pod
        metadata: {{name: {name}{ns}}}
        spec:
          containers:
          - name: c
            image: cuda
            resources: {{limits: {{nvidia.com/gpu: {gpus}{extra}}}}}
    """


def deployment(replicas: int) -> str:
    return f"""
        apiVersion: apps/v1
        kind: Deployment
        metadata: {{name: web, namespace: ml}}
        spec:
          replicas: {replicas}
          selector: {{matchLabels: {{app: web}}}}
          template:
            metadata: {{labels: {{app: web}}}}
            spec:
              containers:
              - {{name: c, image: cuda, resources: {{limits: {{nvidia.com/gpu: 1}}}}}}
    """


@pytest.fixture()
def cluster(tmp_path: Path) -> str:
    return write(tmp_path / "cluster.yaml", NODE, NAMESPACE, QUOTA)


@pytest.fixture()
def pod(tmp_path: Path) -> str:
    return write(tmp_path / "pod.yaml", gpu_pod("p"))


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------- cluster files


def test_a_docker_compose_file_as_cluster_is_an_error_naming_file_and_document(
    tmp_path: Path, pod: str, capsys
) -> None:
    compose = write(tmp_path / "docker-compose.yaml", COMPOSE)
    code, out, err = check(capsys, "--cluster", compose, pod)
    assert code == 2 and out == ""
    assert err.startswith(f"gpu-admission check: error: {compose}: document 0: field kind: no kind: ")
    assert "not a Kubernetes object" in err and "Traceback" not in err


def test_an_empty_folder_as_cluster_is_an_error(tmp_path: Path, pod: str, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = check(capsys, "--cluster", str(empty), pod)
    assert code == 2 and out == ""
    assert f"--cluster {empty}: no *.yaml, *.yml, *.json files" in err


def test_nodes_without_namespaces_is_an_error_saying_what_is_missing(tmp_path: Path, pod: str, capsys) -> None:
    nodes = write(tmp_path / "nodes.yaml", NODE)
    code, out, err = check(capsys, "--cluster", nodes, pod)
    assert code == 2 and out == ""
    assert f"--cluster {nodes}: no Namespace objects" in err and "managedNamespaces: all" in err


def test_namespaces_are_not_needed_when_the_policy_manages_all(tmp_path: Path, pod: str, capsys) -> None:
    nodes = write(tmp_path / "nodes.yaml", NODE)
    policy = write(tmp_path / "policy.yaml", "managedNamespaces: all\n")
    code, out, _ = check(capsys, "--cluster", nodes, "--policy", policy, pod)
    assert code == 0 and out.startswith("ALLOW  Pod ml/p: node gpu-1, 1 GPU x 23034 MiB/100%")


def test_namespaces_without_nodes_is_an_error(tmp_path: Path, pod: str, capsys) -> None:
    namespaces = write(tmp_path / "ns.yaml", NAMESPACE, "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
    code, _, err = check(capsys, "--cluster", namespaces, pod)
    assert code == 2
    assert f"--cluster {namespaces}: no Node objects (found only Namespace, Service)" in err


def test_a_namespace_the_cluster_files_lack_is_warned_about(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = write(tmp_path / "a.yaml", gpu_pod("p", namespace="other"))
    code, out, _ = check(capsys, "--cluster", cluster, manifest)
    assert code == 0
    warning = out.splitlines()[1]
    assert warning.startswith("       warning: Pod other/p: namespace other is not in the cluster files")
    assert "-n" in warning and "managedNamespaces" in warning


def test_the_default_namespace_the_cluster_files_lack_is_warned_about_too(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = write(tmp_path / "a.yaml", gpu_pod("p", namespace=None))
    code, out, _ = check(capsys, "--cluster", cluster, "-o", "json", manifest)
    [result] = json.loads(out)["results"]
    assert code == 0 and result["namespace"] == "default"
    assert any("namespace default is not in the cluster files" in w for w in result["warnings"])
    code, out, _ = check(capsys, "--cluster", cluster, "-n", "ml", "-o", "json", manifest)
    [result] = json.loads(out)["results"]
    assert code == 0 and result["managed"] is True and result["warnings"] == []


# ------------------------------------------------------------------------------------- manifests


def test_an_empty_folder_of_manifests_is_an_error(tmp_path: Path, cluster: str, capsys) -> None:
    empty = tmp_path / "deploy"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a manifest")
    code, out, err = check(capsys, "--cluster", cluster, str(empty))
    assert code == 2 and out == ""
    assert err == f"gpu-admission check: error: {empty}: no manifests in this directory (*.yaml, *.yml, *.json)\n"


def test_manifest_files_without_any_object_are_an_error(tmp_path: Path, cluster: str, capsys) -> None:
    blank = write(tmp_path / "blank.yaml", "# nothing yet\n")
    code, out, err = check(capsys, "--cluster", cluster, blank)
    assert code == 2 and out == "" and "no Kubernetes objects to check" in err


def test_a_document_without_kind_is_an_error_naming_file_and_document(tmp_path: Path, cluster: str, capsys) -> None:
    nokind = "apiVersion: v1\nmetadata: {name: nokind, namespace: ml}\nspec: {containers: [{name: c, image: cuda}]}\n"
    manifest = write(tmp_path / "m.yaml", gpu_pod("ok"), nokind)
    code, out, _ = check(capsys, "--cluster", cluster, manifest)
    lines = out.splitlines()
    assert code == 2
    assert lines[0].startswith("ALLOW  Pod ml/ok: node gpu-1")
    assert lines[1] == (
        f"ERROR  field kind: no kind: not a Kubernetes object (every object states apiVersion and kind)  [{manifest}:1]"
    )
    code, out, _ = check(capsys, "--cluster", cluster, "-o", "json", manifest)
    error = json.loads(out)["results"][1]
    assert (error["error"], error["source"], error["field"], error["name"]) == (True, f"{manifest}:1", "kind", "nokind")


def test_a_compose_file_among_the_manifests_is_an_error(tmp_path: Path, cluster: str, capsys) -> None:
    compose = write(tmp_path / "docker-compose.yaml", COMPOSE)
    code, out, _ = check(capsys, "--cluster", cluster, compose)
    assert code == 2 and out.splitlines()[0].startswith("ERROR  field kind: no kind") and f"[{compose}:0]" in out


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("m.yaml", "kind: Pod\nmetadata:\n  name: x\n   bad: 1\n", "line 4, column 7: invalid YAML:"),
        ("m.json", '{"kind": "Pod",\n  "metadata": }\n', "line 2, column 15: invalid JSON: Expecting value"),
    ],
)
def test_parse_errors_give_line_and_column(
    tmp_path: Path, cluster: str, capsys, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    code, out, _ = check(capsys, "--cluster", cluster, str(path))
    assert code == 2 and out.splitlines()[0].startswith(f"ERROR  {message}")


# ------------------------------------------------------------------------------ formats and exits


def test_yaml_output_is_the_json_report(tmp_path: Path, cluster: str, pod: str, capsys) -> None:
    _, as_json, _ = check(capsys, "--cluster", cluster, "-o", "json", pod)
    code, as_yaml, _ = check(capsys, "--cluster", cluster, "-o", "yaml", pod)
    assert code == 0 and yaml.safe_load(as_yaml) == json.loads(as_json)


def test_table_output_has_a_header_and_one_row_per_workload(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = write(tmp_path / "a.yaml", deployment(2), gpu_pod("big", 9))
    code, out, _ = check(capsys, "--cluster", cluster, "-o", "table", manifest)
    header, first, second, total = out.splitlines()
    assert code == 1
    assert header.split() == [
        "RESULT",
        "KIND",
        "NAMESPACE",
        "NAME",
        "PODS",
        "NODE",
        "GPUS",
        "MEMORY",
        "CORES",
        "REASON",
        "WARNINGS",
        "SOURCE",
    ]
    assert first.split() == [
        "ALLOW",
        "Deployment",
        "ml",
        "web",
        "2",
        "gpu-1",
        "1",
        "23034MiB",
        "100%",
        "admitted",
        "0",
        f"{manifest}:0",
    ]
    assert second.split()[:4] == ["DENY", "Pod", "ml", "big"] and second.split()[5:8] == ["<none>"] * 3
    assert total == "1 allowed, 1 denied, 0 skipped"


def test_fail_on_warn_turns_a_warning_into_exit_1(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = write(tmp_path / "d.yaml", deployment(3))  # the third pod fills the quota: a warning
    code, out, err = check(capsys, "--cluster", cluster, manifest)
    assert code == 0 and "warning:" in out and err == ""
    code, out, err = check(capsys, "--cluster", cluster, "--fail-on-warn", manifest)
    assert code == 1 and err == "gpu-admission check: 1 warning, and --fail-on-warn is set\n"
    code, _, _ = check(
        capsys, "--cluster", cluster, "--fail-on-warn", "-o", "json", write(tmp_path / "one.yaml", gpu_pod("one"))
    )
    assert code == 0


def test_warnings_name_the_workload_and_the_pods_that_drew_them(tmp_path: Path, cluster: str, capsys) -> None:
    code, out, _ = check(capsys, "--cluster", cluster, write(tmp_path / "d.yaml", deployment(3)))
    assert code == 0
    assert out.splitlines()[1] == (
        "       warning: Deployment ml/web x3 (pod 3 of 3): gpus: requests.nvidia.com/gpu "
        "at 100% of quota after this pod"
    )


def test_text_never_shows_none_for_a_pod_admitted_without_gpus(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = write(
        tmp_path / "t.yaml",
        """
        apiVersion: v1
        kind: Pod
        metadata: {name: cpu, namespace: ml}
        spec:
          tolerations: [{operator: Exists}]
          containers: [{name: c, image: cuda}]
    """,
    )
    code, out, _ = check(capsys, "--cluster", cluster, manifest)
    assert code == 0 and "None" not in out
    assert out.splitlines()[0].startswith("ALLOW  Pod ml/cpu: no GPU allocated (neutralised: ")
    assert out.splitlines()[1].startswith("       warning: Pod ml/cpu: asks for no GPU but can reach one")


# ----------------------------------------------------------------------------- unknown GPU memory


@pytest.fixture()
def no_memory_cluster(tmp_path: Path) -> str:
    node = NODE.replace(' nvidia.com/gpu.memory: "23034",', "")
    return write(tmp_path / "nomem.yaml", node, NAMESPACE)


def test_a_node_without_memory_label_is_not_described_as_0_mib(
    tmp_path: Path, no_memory_cluster: str, pod: str, capsys
) -> None:
    code, out, _ = check(capsys, "--cluster", no_memory_cluster, pod)
    lines = out.splitlines()
    assert code == 0 and "x 0 MiB" not in out
    assert lines[0].startswith("ALLOW  Pod ml/p: node gpu-1, 1 GPU x memory unknown/100%, single")
    assert lines[1].startswith("       warning: Pod ml/p: node gpu-1: the memory of its GPUs is unknown")
    assert "nvidia.com/gpu.memory label" in lines[1] and "GPUInventory" in lines[1]


def test_a_memory_request_on_nodes_of_unknown_memory_is_not_told_at_most_0(
    tmp_path: Path, no_memory_cluster: str, capsys
) -> None:
    manifest = write(tmp_path / "m.yaml", gpu_pod("m", extra=", nvidia.com/gpumem: 4000"))
    code, out, _ = check(capsys, "--cluster", no_memory_cluster, manifest)
    assert code == 1 and "at most 0" not in out and "has 0 MiB" not in out
    assert (
        "DENY   Pod ml/m: 422 memory-too-large: asks for 4000 MiB of GPU memory per GPU, but the GPU memory of "
        "the eligible nodes is unknown: their Nodes have no nvidia.com/gpu.memory label"
    ) in out


def test_a_memory_request_over_a_known_card_is_refused_as_before(tmp_path: Path, cluster: str, capsys) -> None:
    manifest = write(tmp_path / "m.yaml", gpu_pod("m", extra=", nvidia.com/gpumem: 40000"))
    code, out, _ = check(capsys, "--cluster", cluster, manifest)
    assert code == 1 and "the largest eligible card has 23034 MiB: lower nvidia.com/gpumem to at most 23034" in out


# ------------------------------------------------------------------------------ demo banner, help


def test_the_exit_1_banner_is_only_for_the_bundled_examples(tmp_path: Path, pod: str, capsys) -> None:
    code, out, _ = check(capsys, str(EXAMPLES))
    assert code == 1 and out.splitlines()[0] == DEMO_BANNER
    code, out, _ = check(capsys, pod)
    assert code == 0 and DEMO_BANNER not in out and "exit code 1" not in out
    assert out.splitlines()[0] == DEMO_NOTE
    copied = tmp_path / "mine"
    copied.mkdir()
    (copied / "01-single-gpu.yaml").write_text((EXAMPLES / "01-single-gpu.yaml").read_text())
    _, out, _ = check(capsys, str(copied))
    assert DEMO_BANNER not in out


def test_the_bundled_example_names_are_those_in_examples() -> None:
    assert set(BUNDLED_EXAMPLES) == {f for f in os.listdir(EXAMPLES) if f.endswith(".yaml")}


@pytest.mark.parametrize("argv", [["version"], ["--version"]])
def test_version(capsys, argv: list[str]) -> None:
    from importlib.metadata import version

    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's version action exits
        code = int(exit.code or 0)
    out, _ = capsys.readouterr()
    assert code == 0 and out == f"gpu-admission {version('gpu-admission')}\n"


@pytest.mark.parametrize("command", [*COMMANDS, "version"])
def test_every_command_help_shows_exit_codes_and_an_example(capsys, command: str) -> None:
    with pytest.raises(SystemExit) as exit:
        main([command, "--help"])
    out, _ = capsys.readouterr()
    assert exit.value.code == 0
    codes = out.split("\nexit codes:\n", 1)[1]
    assert codes.startswith("  0    ") and f"\nexamples:\n  gpu-admission {command}" in out
