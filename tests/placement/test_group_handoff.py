"""A group whose topology Kueue TAS or KAI-Scheduler owns gets no domain from the webhook (their node
selector and ours would fight, and a required affinity to another domain leaves the pod unschedulable),
but its group is still named in the decision record and quotas still apply. The label and annotation
sets are the ones those projects put on pods: Kueue's apis/kueue constants (TopologySchedulingGate,
TASLabel, PodSetLabel, WorkloadAnnotation, the podset-*-topology annotations), KAI's workload topology
annotations and scheduler name."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from builders import H100, node, pod, snapshot
from group_support import cluster_file

from webhook.cli import main
from webhook.core.admission import admit
from webhook.core.domain.model import Node, QuotaLimits, Usage
from webhook.core.placement.group_place import KAI, KUEUE_TAS, topology_owner
from webhook.core.policy.model import Policy

CLIQUE = "nvidia.com/gpu.clique"
REQUIRED = Policy(group_topology="required")


def gpu_node(name: str, clique: str) -> Node:
    return dataclasses.replace(node(name, H100, 4), labels={"nvidia.com/gpu.product": H100[0], CLIQUE: clique})


# Clique c1: 3 nodes, c2: 2 nodes (4 GPUs each).
NODES = [*[gpu_node(f"c1-{i}", "c1") for i in range(3)], *[gpu_node(f"c2-{i}", "c2") for i in range(2)]]
CLUSTER = snapshot(*NODES)
FULL_QUOTA = snapshot(*NODES, quotas={"team-a": (QuotaLimits("gpu-quota", gpus=4),)}, used={"team-a": Usage(4, 0, 400)})


def worker(name: str = "train-worker-0", **meta: Any) -> dict[str, Any]:
    """A PyTorchJob worker pod as the training operator creates it (its labels), 4 GPUs."""
    p = pod({"nvidia.com/gpu": 4}, name=name)
    p["metadata"]["labels"] = {"training.kubeflow.org/job-name": "train",
                               "training.kubeflow.org/operator-name": "pytorchjob-controller",
                               "training.kubeflow.org/replica-type": "worker",
                               "training.kubeflow.org/replica-index": name.rsplit("-", 1)[-1],
                               **meta.get("labels", {})}
    p["metadata"]["annotations"] = {**p["metadata"].get("annotations", {}), **meta.get("annotations", {})}
    if "gates" in meta:
        p["spec"]["schedulingGates"] = [{"name": g} for g in meta["gates"]]
    if "scheduler" in meta:
        p["spec"]["schedulerName"] = meta["scheduler"]
    return p


def kueue_tas_job_pod() -> dict[str, Any]:
    """A worker of a PyTorchJob admitted by Kueue through TAS: the template annotation the user wrote,
    and what Kueue writes into the template when it admits the workload (gate, TAS and podset labels,
    the workload annotation); the pods the operator then creates carry all of it."""
    return worker(labels={"kueue.x-k8s.io/queue-name": "tas-user-queue", "kueue.x-k8s.io/podset": "worker",
                          "kueue.x-k8s.io/tas": "true"},
                  annotations={"kueue.x-k8s.io/podset-required-topology": CLIQUE,
                               "kueue.x-k8s.io/workload": "pytorchjob-train-3c5e1"},
                  gates=["kueue.x-k8s.io/topology"])


def kueue_gated_pod() -> dict[str, Any]:
    """A pod of Kueue's pod integration whose webhook ran before ours: the admission gate and the
    topology gate it adds at creation, and nothing else of TAS (a queue whose flavors are all TAS)."""
    return worker(labels={"kueue.x-k8s.io/queue-name": "tas-user-queue", "kueue.x-k8s.io/managed": "true"},
                  gates=["kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology"])


def kai_pod() -> dict[str, Any]:
    """A worker whose template repeats KAI's workload topology annotations, with KAI's queue label."""
    return worker(labels={"kai.scheduler/queue": "team-a"}, scheduler="kai-scheduler",
                  annotations={"kai.scheduler/topology": "gb200-topology",
                               "kai.scheduler/topology-required-placement": CLIQUE})


def apply(p: dict[str, Any], decision: Any, uid: str = "uid-1") -> dict[str, Any]:
    out = jsonpatch.apply_patch(p, [dict(op) for op in decision.patch]) if decision.patch else copy.deepcopy(p)
    out["metadata"]["uid"] = uid
    return out


def mentions_clique(p: dict[str, Any]) -> bool:
    return CLIQUE in json.dumps(p.get("spec", {}).get("affinity", {}))


HANDED_OFF = [(kueue_tas_job_pod, KUEUE_TAS), (kueue_gated_pod, KUEUE_TAS), (kai_pod, KAI)]


@pytest.mark.parametrize(("make", "owner"), HANDED_OFF, ids=["kueue-tas-job", "kueue-gate", "kai"])
@pytest.mark.parametrize("policy", [REQUIRED, Policy()], ids=["required", "preferred"])
def test_a_pod_whose_topology_another_system_owns_gets_no_group_domain(make, owner, policy) -> None:
    p = make()
    assert topology_owner(p, p["spec"].get("schedulerName", "")) == owner
    decision = admit.mutate(p, CLUSTER, policy)
    assert decision.allowed, decision.message
    allocation = decision.allocation
    assert (allocation.group, allocation.domain) == ("team-a/pytorchjob/train", "")  # named, no domain
    out = apply(p, decision)
    assert not mentions_clique(out)
    # Second pass (reinvocation): the sealed record stands, nothing more to write; validation admits it.
    assert admit.mutate(out, CLUSTER, policy).patch == ()
    assert admit.validate(out, CLUSTER, policy).allowed


@pytest.mark.parametrize(("make", "owner"), HANDED_OFF, ids=["kueue-tas-job", "kueue-gate", "kai"])
def test_quotas_still_apply_to_a_handed_off_group(make, owner) -> None:
    decision = admit.mutate(make(), FULL_QUOTA, REQUIRED)
    assert (decision.allowed, decision.code, decision.reason) == (False, 403, "quota-exceeded")


def test_kueue_annotations_count_when_our_webhook_runs_before_kueues_gate() -> None:
    # Configurations are called in name order: ours may see the pod before Kueue's webhook gates it.
    p = worker(annotations={"kueue.x-k8s.io/podset-preferred-topology": "topology.kubernetes.io/rack"})
    decision = admit.mutate(p, CLUSTER, REQUIRED)
    assert decision.allowed and decision.allocation.domain == ""
    out = apply(p, decision)
    out["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/topology"}]  # Kueue's webhook, after ours
    assert admit.mutate(out, CLUSTER, REQUIRED).patch == ()  # the reinvocation changes nothing
    assert admit.validate(out, CLUSTER, REQUIRED).allowed and not mentions_clique(out)


def test_unconstrained_is_a_boolean_as_kueue_parses_it() -> None:
    assert topology_owner(worker(annotations={"kueue.x-k8s.io/podset-unconstrained-topology": "true"}), "") == KUEUE_TAS
    assert topology_owner(worker(annotations={"kueue.x-k8s.io/podset-unconstrained-topology": "false"}), "") == ""
    assert topology_owner(worker(scheduler="volcano"), "volcano") == "volcano"
    assert topology_owner(worker(labels={"kueue.x-k8s.io/queue-name": "q"}), "") == ""  # a queue alone: ours


def test_a_plain_group_in_the_same_namespace_still_gets_its_domain() -> None:
    snap = CLUSTER
    for make in (kueue_tas_job_pod, kueue_gated_pod, kai_pod):  # handed-off pods admitted first
        decision = admit.mutate(make(), snap, REQUIRED)
        assert decision.allowed and decision.allocation.domain == ""
    plain = pod({"nvidia.com/gpu": 4}, name="other-0", annotations={"gpu-admission.io/group": "other",
                                                                    "gpu-admission.io/group-size": "2"})
    decision = admit.mutate(plain, snap, REQUIRED)
    assert decision.allowed, decision.message
    assert (decision.allocation.group, decision.allocation.domain) == ("team-a/other", f"{CLIQUE}=c2")
    assert mentions_clique(apply(plain, decision))


def _job(tmp_path: Path, annotations: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(f"""\
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: train, namespace: ml, labels: {{kueue.x-k8s.io/queue-name: tas-user-queue}}}}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 4
      template:
        metadata:
          annotations: {{{annotations}}}
        spec:
          containers:
          - name: pytorch
            image: pytorch:2
            resources: {{limits: {{nvidia.com/gpu: "8"}}}}
""")
    return str(path)


@pytest.mark.parametrize(("annotations", "owner"), [
    (f"kueue.x-k8s.io/podset-required-topology: {CLIQUE}", "Kueue TAS"),
    (f"kai.scheduler/topology: t, kai.scheduler/topology-preferred-placement: {CLIQUE}", "KAI"),
])
def test_check_says_whose_topology_it_is(tmp_path: Path, capsys, annotations: str, owner: str) -> None:
    cluster = cluster_file(tmp_path, {"a": 3, "b": 4})
    assert main(["check", "-o", "json", "--cluster", cluster, _job(tmp_path, annotations)]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["allowed"] and result["message"].endswith(f", topology left to {owner}")
    assert all(p["group"]["topology"] == owner and not p["allocation"].get("domain") for p in result["pods"])
    # The same job without those annotations: the webhook keeps it in one clique.
    assert main(["check", "-o", "json", "--cluster", cluster, _job(tmp_path, "")]) == 0
    (plain,) = json.loads(capsys.readouterr().out)["results"]
    assert plain["message"].endswith(f"all in {CLIQUE}=b") and "topology" not in plain["pods"][0]["group"]


def test_the_server_neither_records_nor_counts_a_group_kueue_or_kai_places() -> None:
    # Through the validating webhook: a domainless group pod of the default scheduler would count as
    # "split" in /metrics; one whose topology Kueue TAS or KAI owns is theirs, not split.
    from group_support import app_over, cliques_cache, post, worker_review
    from server_support import samples

    from webhook.cluster.source import LiveSource
    from webhook.server.app import EXTENSION

    source = LiveSource(cliques_cache({"a": 2}))
    app = app_over(source, {"tas": "", "gated": "", "kai": ""})
    client = app.test_client()
    tas, gated, kai = worker_review("tas", 0), worker_review("gated", 0), worker_review("kai", 0)
    tas["request"]["object"]["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] = CLIQUE
    gated["request"]["object"]["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/topology"}]
    kai["request"]["object"]["metadata"]["annotations"]["kai.scheduler/topology-required-placement"] = CLIQUE
    assert all(post(client, review)["allowed"] for review in (tas, gated, kai))
    assert source.snapshot().groups == {}
    assert set(samples(app.extensions[EXTENSION].metrics, "gpu_admission_groups_total").values()) == {0.0}
