"""`gpu-admission check` places the replicas of one workload as a group: every pod in one NVLink domain
(the first chooses, the ledger's `groups.commit` runs between replicas, later ones follow), or the verdict
says why not with the figures; `-o json` lists each replica's allocation."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from group_support import cluster_file

from webhook.cli import main

CLIQUE = "nvidia.com/gpu.clique"




def pytorchjob(tmp_path: Path, workers: int, size: int | None = None) -> str:
    text = textwrap.dedent(f"""\
        apiVersion: kubeflow.org/v1
        kind: PyTorchJob
        metadata: {{name: train, namespace: ml}}
        spec:
          pytorchReplicaSpecs:
            Worker:
              replicas: {workers}
              template:
                spec:
                  containers:
                  - name: pytorch
                    image: pytorch:2
                    resources: {{limits: {{nvidia.com/gpu: "8"}}}}
        """)
    if size:  # the pod author states the group's size (the training operator does not)
        stated = f"        metadata:\n          annotations: {{gpu-admission.io/group-size: \"{size}\"}}\n"
        text = text.replace("      template:\n", "      template:\n" + stated)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def policy_file(tmp_path: Path, mode: str) -> str:
    path = tmp_path / f"policy-{mode}.yaml"
    path.write_text(f"groupTopology:\n  mode: {mode}\n")
    return str(path)


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code = main(["check", "-o", "json", *args])
    out, err = capsys.readouterr()
    assert err == ""
    return code, json.loads(out)


def cliques_of(result: dict[str, Any]) -> list[str]:
    return [pod["allocation"]["node"].split("-")[0] for pod in result["pods"] if pod["allocation"]["node"]]


def test_four_workers_land_in_one_clique_where_a_group_blind_placement_splits_them(tmp_path: Path, capsys) -> None:
    # Clique a (3 nodes) sorts first and binpack alone fills it before moving on; only b holds all four.
    cluster = cluster_file(tmp_path, {"a": 3, "b": 4})
    job = pytorchjob(tmp_path, workers=4)
    code, report = check(capsys, "--cluster", cluster, job)
    (result,) = report["results"]
    assert code == 0 and result["allowed"]
    assert cliques_of(result) == ["b", "b", "b", "b"]
    assert [pod["name"] for pod in result["pods"]] == [f"train-worker-{i}" for i in range(4)]
    assert {pod["domain"] for pod in result["pods"]} == {f"{CLIQUE}=b"}
    assert all(pod["allocation"]["group"] == "ml/pytorchjob/train" for pod in result["pods"])
    assert "all in nvidia.com/gpu.clique=b" in result["message"]
    # The same job with groups switched off by the policy: placed pod by pod, it spans both cliques.
    code, blind = check(capsys, "--cluster", cluster, "--policy", policy_file(tmp_path, "none"), job)
    assert sorted(set(cliques_of(blind["results"][0]))) == ["a", "b"]


def test_text_output_names_the_domain(tmp_path: Path, capsys) -> None:
    cluster = cluster_file(tmp_path, {"a": 3, "b": 4})
    assert main(["check", "--cluster", cluster, pytorchjob(tmp_path, workers=4)]) == 0
    out = capsys.readouterr().out
    assert "4 pods admitted; nodes b-0, b-1, b-2, b-3, all in nvidia.com/gpu.clique=b" in out


def test_a_job_too_big_for_any_clique_is_refused_with_the_figures(tmp_path: Path, capsys) -> None:
    cluster = cluster_file(tmp_path, {"a": 2, "b": 4})  # the largest clique: 32 GPUs
    job = pytorchjob(tmp_path, workers=5, size=5)
    code, report = check(capsys, "--cluster", cluster, "--policy", policy_file(tmp_path, "required"), job)
    (result,) = report["results"]
    assert (code, result["allowed"], result["code"], result["reason"]) == (1, False, 422, "group-too-large")
    assert result["message"] == ("pod 1 of 5: group ml/pytorchjob/train needs 40 GPUs (5 pods x 8) in one "
                                 "nvidia.com/gpu.clique; the largest has 32")
    assert [(p["name"], p["allowed"], p["code"]) for p in result["pods"]] == [("train-worker-0", False, 422)]
    # Preferred (the default): admitted, split over the cliques, and the warning gives the same figures.
    code, report = check(capsys, "--cluster", cluster, job)
    (result,) = report["results"]
    assert code == 0 and len(result["pods"]) == 5 and sorted(set(cliques_of(result))) == ["a", "b"]
    assert ("group ml/pytorchjob/train needs 40 GPUs (5 pods x 8) in one nvidia.com/gpu.clique; the largest has 32:"
            " placed split") in result["warnings"]


def test_a_job_sized_by_its_manifest_that_outgrows_its_clique_is_placed_split_with_the_figures(
    tmp_path: Path, capsys
) -> None:
    # The PyTorchJob states its size (5 workers), as the watched object does online: no open-ended group,
    # no note asking for gpu-admission.io/group-size; preferred mode splits it and says why.
    cluster = cluster_file(tmp_path, {"a": 2, "b": 4})
    code, report = check(capsys, "--cluster", cluster, pytorchjob(tmp_path, workers=5))
    (result,) = report["results"]
    assert code == 0 and len(result["pods"]) == 5 and sorted(set(cliques_of(result))) == ["a", "b"]
    assert result["pods"][0]["group"]["size"] == 5
    assert ("group ml/pytorchjob/train needs 40 GPUs (5 pods x 8) in one nvidia.com/gpu.clique; the largest has 32:"
            " placed split") in result["warnings"]
    assert not any("gpu-admission.io/group-size" in note for note in result.get("notes", []))


def test_leaderworkerset_groups_carry_their_size_and_each_takes_its_own_clique(tmp_path: Path, capsys) -> None:
    # Two groups of 4 pods x 8 GPUs. Knowing its size from the controller's annotation, group 0 takes the
    # 4-node clique that fits it exactly and its promise keeps group 1 out of it; without the size both
    # would start in the roomier clique b and group 1 would not fit there whole.
    cluster = cluster_file(tmp_path, {"a": 4, "b": 6})
    path = tmp_path / "lws.yaml"
    path.write_text(textwrap.dedent("""\
        apiVersion: leaderworkerset.x-k8s.io/v1
        kind: LeaderWorkerSet
        metadata: {name: serve, namespace: ml}
        spec:
          replicas: 2
          leaderWorkerTemplate:
            size: 4
            leaderTemplate:
              spec:
                containers: [{name: leader, image: vllm, resources: {limits: {nvidia.com/gpu: "8"}}}]
            workerTemplate:
              spec:
                containers: [{name: worker, image: vllm, resources: {limits: {nvidia.com/gpu: "8"}}}]
        """))
    code, report = check(capsys, "--cluster", cluster, "--policy", policy_file(tmp_path, "required"), str(path))
    leaders, workers = report["results"]
    assert code == 0 and leaders["allowed"] and workers["allowed"]
    by_group: dict[str, set[str]] = {}
    for pod in leaders["pods"] + workers["pods"]:
        by_group.setdefault(pod["allocation"]["group"], set()).add(pod["domain"])
    assert by_group == {"ml/lws/serve/0": {f"{CLIQUE}=a"}, "ml/lws/serve/1": {f"{CLIQUE}=b"}}
    assert all(pod["allocation"]["node"] for pod in leaders["pods"] + workers["pods"])  # none waits


DOCS = Path(__file__).resolve().parents[2] / "docs" / "groups"


def test_the_documented_examples_give_the_documented_answers(capsys) -> None:
    code, report = check(capsys, "--cluster", str(DOCS / "nvl72-cluster.yaml"), str(DOCS / "pytorchjob-16x4.yaml"))
    (result,) = report["results"]
    clique = f"{CLIQUE}=4f0c8a2e-6b1d-4c3e-9f7a-2d5b8e1c0a93.2"
    assert code == 0 and {pod["domain"] for pod in result["pods"]} == {clique} and len(result["pods"]) == 16
    assert all(pod["allocation"]["node"].startswith("gb200-r2-") for pod in result["pods"])
    assert result["pods"][0]["group"] == {"name": "ml/pytorchjob/llm-pretrain", "size": 16, "minimum": 16}
    code, report = check(capsys, "--cluster", str(DOCS / "rack-cluster.yaml"), str(DOCS / "jobset-rack.yaml"))
    (result,) = report["results"]
    # The JobSet states its size (3 Jobs x parallelism 1): best fit takes the rack with exactly three free.
    assert code == 0 and {pod["domain"] for pod in result["pods"]} == {"topology.kubernetes.io/rack=rack-1"}
    assert result["pods"][0]["group"] == {"name": "ml/jobset/finetune/workers", "size": 3, "minimum": 3}


def test_check_follows_the_groups_the_webhook_already_placed(tmp_path: Path, capsys) -> None:
    # The ledger's ConfigMap, as `check --kubeconfig` lists it: job `train` lives in clique a, two of its
    # four pods admitted. Its other workers follow there, though clique b has more room.
    cluster = cluster_file(tmp_path, {"a": 3, "b": 4})
    record = {"namespace": "ml", "name": "pytorchjob/train", "level": CLIQUE, "domain": "a", "size": 4,
              "gpusPerPod": 8, "members": ["uid-0", "uid-1"]}
    ledger = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "gpu-admission-groups", "namespace": "gpu-admission",
                           "labels": {"gpu-admission.io/ledger": "groups"}},
              "data": {"groups": json.dumps([{"record": record}])}}
    with open(cluster, "a") as f:
        f.write(textwrap.indent(json.dumps(ledger), "- ").replace("\n", " ") + "\n")
    code, report = check(capsys, "--cluster", cluster, pytorchjob(tmp_path, workers=2, size=4))
    (result,) = report["results"]
    assert code == 0 and cliques_of(result) == ["a", "a"]
    code, report = check(capsys, "--cluster", cluster_file(tmp_path, {"a": 3, "b": 4}), pytorchjob(tmp_path, 2, 4))
    assert cliques_of(report["results"][0]) == ["b", "b"]  # without the record: the first pod chooses anew
