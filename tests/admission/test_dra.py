"""GPUs through Dynamic Resource Allocation: counted against the same quotas and rules, or refused.

The claims are NVIDIA DRA driver shapes (tests/fixtures/dra/claims.yaml, written from the documented
resource.k8s.io API) and real manifests (the JobSet workload-aware-scheduling example, Kueue's
extended-resource Job).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from builders import A100, H100, node, pod, snapshot

from webhook.core.admission import admit, dra
from webhook.core.domain.model import QuotaLimits, Snapshot, Usage
from webhook.core.podspec.record import ANNOTATION
from webhook.core.policy.model import NamespaceRule, Policy, PolicyError, parse_policy

FIXTURES = Path(__file__).parent.parent / "fixtures" / "dra"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((FIXTURES / name).read_text()) if d]


CLAIMS = documents("claims.yaml")
TEMPLATES = {f"team-a/{d['metadata']['name']}": dra.read_claim(d)
             for d in CLAIMS if d["kind"] == "ResourceClaimTemplate"}
CLAIMED = {f"team-a/{d['metadata']['name']}": dra.read_claim(d) for d in CLAIMS if d["kind"] == "ResourceClaim"}


def cluster(**kwargs: Any) -> Snapshot:
    base = snapshot(node("h1", H100, 8), node("a1", A100, 8, "paired"), **kwargs)
    return dataclasses.replace(base, claims=CLAIMED, claim_templates=TEMPLATES)


def jobset_pod() -> dict[str, Any]:
    """A worker pod of the JobSet example: one claim from `gpu-claim-template` (2 GPUs in claims.yaml)."""
    jobset = documents("jobset-site-static-examples-workload-aware-scheduling-dra-jobset.yaml")[0]
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "workers-0", "namespace": "team-a"},
            "spec": template["spec"]}


def claim_pod(claim: str, *, name: str = "p", namespace: str = "team-a", template: bool = False) -> dict[str, Any]:
    key = "resourceClaimTemplateName" if template else "resourceClaimName"
    p = pod(name=name, namespace=namespace, resourceClaims=[{"name": "gpu", key: claim}])
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return p


DEFAULT = Policy()


def chain(p: dict[str, Any], snap: Snapshot, policy: Policy = DEFAULT) -> tuple[Any, dict[str, Any], Any]:
    m = admit.mutate(p, snap, policy)
    assert m.allowed, m.message
    patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    patched["metadata"]["uid"] = "uid-1"
    return m, patched, admit.validate(patched, snap, policy)


# ------------------------------------------------------------------------------------------ pods


def test_jobset_workers_count_their_template_claims_against_the_gpu_quota() -> None:
    snap = cluster(quotas={"team-a": (QuotaLimits("gpu-quota", gpus=4),)}, used={"team-a": Usage(3, 0, 300)})
    decision = admit.mutate(jobset_pod(), snap, Policy())
    assert not decision.allowed and decision.reason == "quota-exceeded"
    assert "requests.nvidia.com/gpu used 3, asked 2, limit 4" in decision.message


def test_jobset_workers_meet_the_per_pod_maximum() -> None:
    policy = Policy(namespaces={"team-a": NamespaceRule(max_gpus_per_pod=1)})
    decision = admit.validate(jobset_pod(), cluster(), policy)
    assert not decision.allowed and decision.reason == "max-gpus-per-pod"
    assert decision.message.startswith("asks for 2 GPUs in one pod")


def test_a_template_claim_pod_is_recorded_counted_and_left_to_the_dra_scheduler() -> None:
    m, patched, v = chain(jobset_pod(), cluster())
    record = json.loads(patched["metadata"]["annotations"][ANNOTATION])
    assert (record["node"], record["gpuCount"], record["vendor"], record["policy"]) == (None, 2, "nvidia", "dra")
    assert record["memoryMiB"] == H100[1]  # no model pinned: the largest card, never less than held
    assert "affinity" not in patched["spec"]  # placement belongs to the DRA plugin
    assert patched["spec"]["resourceClaims"] == jobset_pod()["spec"]["resourceClaims"]
    assert v.allowed and v.allocation is not None and v.allocation.usage() == Usage(2, 2 * H100[1], 200)


def test_allocation_mode_all_cannot_be_counted_and_is_refused() -> None:
    decision = admit.mutate(claim_pod("every-gpu"), cluster(), Policy())
    assert not decision.allowed and (decision.code, decision.reason) == (403, "dra-all-devices")
    assert "allocationMode: All" in decision.message and "ExactCount" in decision.message


def test_admin_access_is_refused_in_a_tenant_namespace() -> None:
    decision = admit.mutate(claim_pod("gpu-monitor"), cluster(), Policy())
    assert not decision.allowed and decision.reason == "dra-admin-access"
    assert "ResourceClaim gpu-monitor request 'watch' sets adminAccess: true" in decision.message


def test_a_claim_the_webhook_has_not_seen_is_refused() -> None:
    decision = admit.mutate(claim_pod("nowhere"), cluster(), Policy())
    assert not decision.allowed and decision.reason == "dra-unknown-claim"
    assert "ResourceClaim team-a/nowhere is not known" in decision.message
    template = admit.mutate(claim_pod("nowhere", template=True), cluster(), Policy())
    assert not template.allowed and "ResourceClaimTemplate team-a/nowhere" in template.message


def test_a_claim_reserved_for_a_pod_no_live_pod_holds_is_counted_for_the_next() -> None:
    # reservedFor names first-user, but no live pod of the snapshot holds the claim (it ended): its GPU
    # is in no namespace usage, so the next pod naming it is charged it.
    for name in ("second-user", "first-user"):
        decision = admit.mutate(claim_pod("held", name=name), cluster(), Policy())
        assert decision.allowed and decision.allocation is not None and decision.allocation.gpu_count == 1


def test_mig_and_v1beta1_claims_count_one_device_each() -> None:
    m, _, _ = chain(claim_pod("mig-1g"), cluster())
    assert m.allocation is not None and (m.allocation.gpu_count, m.allocation.memory_mib) == (1, 10240)
    m, _, _ = chain(claim_pod("one-gpu-beta"), cluster())
    assert m.allocation is not None and m.allocation.gpu_count == 1


def test_first_available_counts_its_largest_alternative_and_needs_a_model_where_models_are_limited() -> None:
    m, _, _ = chain(claim_pod("h100-or-a100"), cluster())
    assert m.allocation is not None and m.allocation.gpu_count == 2
    policy = Policy(namespaces={"team-a": NamespaceRule(allowed_models=("H100",))})
    decision = admit.mutate(claim_pod("h100-or-a100"), cluster(), policy)
    assert not decision.allowed and decision.reason == "dra-model-undecided"
    assert "request 'gpu'" in decision.message and "productName" in decision.message


def test_a_pinned_model_outside_the_allowed_list_is_refused() -> None:
    policy = Policy(namespaces={"team-a": NamespaceRule(allowed_models=("A100",))})
    decision = admit.mutate(claim_pod("h100-or-a100"), cluster(), policy)
    assert not decision.allowed and decision.reason in ("model-not-allowed", "dra-model-undecided")
    assert "NVIDIA-H100-80GB-HBM3" in decision.message


def test_a_claim_of_another_device_class_is_not_a_gpu() -> None:
    decision = admit.mutate(claim_pod("nic"), cluster(), Policy())
    assert decision.allowed and decision.reason == "not-gpu-pod" and decision.patch == ()


def test_gpus_asked_both_ways_are_refused() -> None:
    p = claim_pod("one-gpu-beta")
    p["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": 1}
    decision = admit.mutate(p, cluster(), Policy())
    assert not decision.allowed and decision.reason == "mixed-gpu-sources" and decision.code == 422


def test_unmanaged_namespaces_are_left_alone() -> None:
    decision = admit.mutate(claim_pod("every-gpu", namespace="sandbox"), cluster(), Policy())
    assert decision.allowed and decision.reason == "not-managed"


def test_the_device_classes_are_the_policys() -> None:
    policy = parse_policy({"dra": {"deviceClasses": ["sriov.example.com"]}})
    m = admit.mutate(claim_pod("nic"), cluster(), policy)
    assert m.allowed and m.allocation is not None and m.allocation.gpu_count == 1
    assert admit.mutate(claim_pod("every-gpu"), cluster(), policy).reason == "not-gpu-pod"


def test_the_server_fast_path_sends_claim_pods_to_the_decision() -> None:
    assert dra.may_use_gpu(jobset_pod())
    assert dra.may_use_gpu(pod({"example.com/gpu": 1}))
    assert not dra.may_use_gpu(pod({"cpu": 1}))


# ------------------------------------------------------------------------------------------ extended resources


def kueue_pod() -> dict[str, Any]:
    job = documents("kueue-site-examples-dra-sample-dra-extended-resource-job.yaml")[0]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sample-0", "namespace": "team-a"},
            "spec": job["spec"]["template"]["spec"]}


def test_an_extended_resource_served_through_dra_is_counted_once_when_the_policy_names_it() -> None:
    policy = parse_policy({"dra": {"extendedResources": ["example.com/gpu"]}})
    m, _, v = chain(kueue_pod(), cluster(), policy)
    assert m.allocation is not None and m.allocation.gpu_count == 1 and v.allowed
    assert not any("example.com/gpu" in w for w in m.warnings)
    snap = cluster(quotas={"team-a": (QuotaLimits("gpu-quota", gpus=1),)}, used={"team-a": Usage(1, 0, 100)})
    assert admit.mutate(kueue_pod(), snap, policy).reason == "quota-exceeded"
    # Without the policy entry it stays an unknown resource: allowed, with the warning that says so.
    plain = admit.mutate(kueue_pod(), snap, Policy())
    assert plain.allowed and plain.reason == "accelerator-not-counted"


def test_the_vendor_gpu_resource_cannot_be_listed_as_an_extended_resource_twice() -> None:
    with pytest.raises(PolicyError, match=r"^dra\.extendedResources\[0\]: nvidia\.com/gpu is counted already"):
        parse_policy({"dra": {"extendedResources": ["nvidia.com/gpu"]}})
    with pytest.raises(PolicyError, match=r"^dra\.deviceClasses: expected a list"):
        parse_policy({"dra": {"deviceClasses": "gpu.nvidia.com"}})


def test_nvidia_gpu_through_a_dra_device_class_counts_once_not_again_for_the_schedulers_claim() -> None:
    """`nvidia.com/gpu: 1` is counted from resources; the claim kube-scheduler then makes for the pod is
    named by no pod's resourceClaims, so it adds nothing, and writing it is allowed."""
    from webhook.core.admission.dra_objects import check_claim_object

    scheduler_claim = documents("extended-deviceclass.yaml")[1]
    key = f"team-a/{scheduler_claim['metadata']['name']}"
    snap = dataclasses.replace(cluster(quotas={"team-a": (QuotaLimits("gpu-quota", gpus=1),)}),
                               claims={**CLAIMED, key: dra.read_claim(scheduler_claim)})
    m, _, v = chain(pod({"nvidia.com/gpu": 1}, name="trainer-0"), snap)
    assert m.allocation is not None and m.allocation.usage().gpus == 1 and v.allowed
    request = {"operation": "CREATE", "namespace": "team-a", "object": scheduler_claim}
    assert check_claim_object(request, snap, Policy()).allowed


# ------------------------------------------------------------------------------------------ check --cluster


CLUSTER_FILE = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: gpu-1
    labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, nvidia.com/gpu.memory: "81559", nvidia.com/gpu.count: "8"}
  status:
    allocatable: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "8"}
- apiVersion: v1
  kind: Namespace
  metadata: {name: team-a, labels: {gpu-admission.io/enabled: "true"}}
- apiVersion: v1
  kind: ResourceQuota
  metadata: {name: gpus, namespace: team-a}
  spec: {hard: {requests.nvidia.com/gpu: "5"}}
"""


def test_check_counts_the_claims_of_cluster_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The JobSet's 3 x 2 workers ask 2 GPUs each through gpu-claim-template (from claims.yaml, a
    --cluster file): two fit the quota of 5, the third does not."""
    from webhook.cli import main

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER_FILE)
    manifest = tmp_path / "jobset.yaml"
    manifest.write_text((FIXTURES / "jobset-site-static-examples-workload-aware-scheduling-dra-jobset.yaml")
                        .read_text())
    code = main(["check", "--cluster", str(cluster), "--cluster", str(FIXTURES / "claims.yaml"),
                 "--namespace", "team-a", "-o", "json", str(manifest)])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    (result,) = report["results"]
    assert result["allowed"] is False and "requests.nvidia.com/gpu used 4, asked 2, limit 5" in result["message"]


def test_a_malformed_claim_in_a_cluster_file_names_file_document_and_field(tmp_path: Path) -> None:
    from webhook.cluster.files import load_cluster
    from webhook.errors import UserError

    broken = tmp_path / "claims.yaml"
    broken.write_text((FIXTURES / "claims.yaml").read_text().replace("count: 2", "count: two", 1))
    with pytest.raises(UserError) as raised:
        load_cluster([str(broken)])
    text = str(raised.value)
    assert str(broken) in text and "spec.spec.devices.requests[0].exactly.count" in text


# ------------------------------------------------------------------------------------------ pods that run


def running(name: str, claim: str, *, template: bool = False, made: str | None = None,
            phase: str = "Running") -> dict[str, Any]:
    """A pod as the watch sees it once admitted: resources name no GPU, its claims hold them."""
    key = "resourceClaimTemplateName" if template else "resourceClaimName"
    status: dict[str, Any] = {"phase": phase}
    if made:
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": made}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}"},
            "spec": {"nodeName": "gpu-1", "resourceClaims": [{"name": "gpu", key: claim}],
                     "containers": [{"name": "c", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}]},
            "status": status}


def made_claim(name: str, count: int) -> dict[str, Any]:
    """The claim the resourceclaim controller makes for a pod from gpu-claim-template."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                           "count": count}}]}}}


def cluster_objects(*pods: dict[str, Any]) -> list[dict[str, Any]]:
    base = yaml.safe_load(CLUSTER_FILE)["items"]
    return [*base, *CLAIMS, made_claim("workers-0-gpu-x1", 2), *pods]


def test_pods_holding_claims_count_against_the_quota_while_they_run() -> None:
    from webhook.cluster.cache import ClusterCache
    from webhook.cluster.translate import build_snapshot

    objects = cluster_objects(
        running("workers-0", "gpu-claim-template", template=True, made="workers-0-gpu-x1"),  # its made claim: 2
        running("workers-1", "gpu-claim-template", template=True),  # claim not made yet: the template's 2
        running("first-user", "held"),  # a named claim: 1
        running("second-user", "held"),  # the same claim again: counted once
        running("done", "mig-1g", phase="Succeeded"),  # finished: holds nothing
    )
    snap = build_snapshot(objects)
    assert snap.namespace_usage["team-a"].gpus == 5
    cache = ClusterCache(clock=lambda: 0.0)
    by_kind = {"Node": "nodes", "Namespace": "namespaces", "ResourceQuota": "resourcequotas", "Pod": "pods",
               "ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}
    for kind, plural in by_kind.items():
        cache.replace(plural, [o for o in objects if o["kind"] == kind])
    assert cache.snapshot().namespace_usage == snap.namespace_usage
    cache.apply("pods", "DELETED", objects[-4])  # workers-1 gone
    assert cache.snapshot().namespace_usage["team-a"].gpus == 3
    cache.apply("resourceclaims", "DELETED", made_claim("workers-0-gpu-x1", 2))
    assert cache.snapshot().namespace_usage["team-a"].gpus == 1


def test_a_second_dra_pod_sees_the_gpus_of_the_first_once_it_runs() -> None:
    """Quota 5, each JobSet worker 2 GPUs: with two workers running, a third is refused; before, the
    running ones counted nothing (their resources name no GPU) and every worker was admitted."""
    from webhook.cluster.translate import build_snapshot

    snap = build_snapshot(cluster_objects(
        running("workers-0", "gpu-claim-template", template=True, made="workers-0-gpu-x1"),
        running("workers-1", "gpu-claim-template", template=True),
    ))
    decision = admit.mutate(jobset_pod(), snap, Policy())
    assert not decision.allowed and "requests.nvidia.com/gpu used 4, asked 2, limit 5" in decision.message


def test_running_pods_are_counted_with_the_policys_device_classes() -> None:
    from webhook.cluster.cache import ClusterCache
    from webhook.cluster.translate import build_snapshot

    objects = cluster_objects(running("vf-user", "nic"))
    assert "team-a" not in build_snapshot(objects).namespace_usage  # sriov.example.com is no GPU by default
    assert build_snapshot(objects, dra_classes=("sriov.example.com",)).namespace_usage["team-a"].gpus == 1
    classes = [("gpu.nvidia.com",)]
    cache = ClusterCache(clock=lambda: 0.0, dra_classes=lambda: classes[0])
    for kind, plural in (("ResourceClaim", "resourceclaims"), ("Pod", "pods")):
        cache.replace(plural, [o for o in objects if o["kind"] == kind])
    assert "team-a" not in cache.snapshot().namespace_usage
    classes[0] = ("sriov.example.com",)  # the policy was reloaded: the next snapshot counts with it
    assert cache.snapshot().namespace_usage["team-a"].gpus == 1


def test_check_reads_claim_templates_written_next_to_the_workload(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from webhook.cli import main

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER_FILE)
    jobset = FIXTURES / "jobset-site-static-examples-workload-aware-scheduling-dra-jobset.yaml"
    code = main(["check", "--cluster", str(cluster), "--namespace", "team-a", "-o", "json",
                 str(FIXTURES / "claims.yaml"), str(jobset)])
    results = json.loads(capsys.readouterr().out)["results"]
    assert code == 1
    assert not any(r.get("skipped") for r in results)  # claims are decided as the webhook decides them
    assert [r["kind"] for r in results][-1] == "JobSet"
    denied = {r["name"]: r["reason"] for r in results if r["kind"] != "JobSet" and not r["allowed"]}
    assert denied == {"every-gpu": "dra-all-devices", "gpu-monitor": "dra-admin-access"}
    assert "requests.nvidia.com/gpu used 4, asked 2, limit 5" in results[-1]["message"]
    # Without the template the workers' claims cannot be counted: refused, saying so.
    main(["check", "--cluster", str(cluster), "--namespace", "team-a", "-o", "json", str(jobset)])
    (alone,) = json.loads(capsys.readouterr().out)["results"]
    assert alone["allowed"] is False and "ResourceClaimTemplate team-a/gpu-claim-template is not known" in alone[
        "message"]


def test_a_claim_on_nvidias_vfio_class_counts_as_gpus() -> None:
    """NVIDIA's DRA driver also installs vfio.gpu.nvidia.com (GPUs bound to vfio-pci for a VM): counted."""
    vfio = {"metadata": {"name": "vm-gpus", "namespace": "team-a"}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "vfio.gpu.nvidia.com", "allocationMode": "ExactCount",
                                    "count": 2}}]}}}
    snap = dataclasses.replace(cluster(), claims={**CLAIMED, "team-a/vm-gpus": dra.read_claim(vfio)})
    m, _, _ = chain(claim_pod("vm-gpus"), snap)
    assert m.allowed and m.allocation is not None and m.allocation.gpu_count == 2
