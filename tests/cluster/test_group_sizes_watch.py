"""The watch cache keeps the sizes the controllers' objects state (`Snapshot.group_sizes`), as
`build_snapshot` reads them from the same objects, and the webhook places a PyTorchJob whole from its
first pod without a size annotation: the domain is chosen and promised for every pod of the job."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
from fake_custom_objects import refusing_lister
from group_support import CLIQUE, clique_node, cliques_cache

from webhook.cluster.cache import ClusterCache
from webhook.cluster.source import LiveSource
from webhook.cluster.translate import build_snapshot
from webhook.core.admission import admit
from webhook.core.placement.group_place import placed_here
from webhook.core.policy.model import Policy


def pytorchjob(name: str, workers: int, namespace: str = "team-a") -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template},
                                             "Worker": {"replicas": workers, "template": template}}},
            "status": {"conditions": [{"type": "Created", "status": "True"}]}}


def worker(job: str, index: int) -> dict[str, Any]:
    """A pod as the training operator makes it: labels only, no size annotation."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job}-worker-{index}", "namespace": "team-a", "uid": f"{job}-{index}",
                         "labels": {"training.kubeflow.org/job-name": job,
                                    "training.kubeflow.org/replica-type": "worker",
                                    "training.kubeflow.org/replica-index": str(index),
                                    "training.kubeflow.org/operator-name": "pytorchjob-controller"},
                         "annotations": {"gpu-admission.io/group-topology": "required"}},
            "spec": {"containers": [{"name": "main", "image": "train",
                                     "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}


PODGROUP = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "pg", "namespace": "team-b"}, "spec": {"minMember": 3}}
JOBSET = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js", "namespace": "team-b"},
          "spec": {"replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": {"parallelism": 2}}}]}}


def test_the_cache_keeps_the_sizes_as_build_snapshot_reads_them_and_follows_edits_and_deletions() -> None:
    cache = cliques_cache({"a": 1})
    cache.replace("pytorchjobs", [pytorchjob("train", 3)])
    cache.replace("volcanopodgroups", [PODGROUP])
    cache.replace("jobsets", [JOBSET])
    expected = {"team-a/pytorchjob/train": 4, "team-b/podgroup/pg": 3, "team-b/jobset/js/w": 4}
    assert cache.snapshot().group_sizes == expected
    objects = [clique_node("a-n0", "a"), pytorchjob("train", 3), PODGROUP, JOBSET,
               {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "js", "namespace": "team-b"},
                "spec": {"parallelism": 9}}]
    assert build_snapshot(objects).group_sizes == expected
    # A status update changes no size: the published snapshot stays the same object.
    before = cache.snapshot()
    cache.apply("pytorchjobs", "MODIFIED", {**pytorchjob("train", 3), "status": {"conditions": []}})
    assert cache.snapshot() is before
    cache.apply("pytorchjobs", "MODIFIED", pytorchjob("train", 7))
    assert cache.snapshot().group_sizes["team-a/pytorchjob/train"] == 8
    cache.apply("volcanopodgroups", "DELETED", PODGROUP)
    cache.replace("jobsets", [])
    assert cache.snapshot().group_sizes == {"team-a/pytorchjob/train": 8}


def test_a_pytorchjobs_first_pod_is_placed_and_promised_for_its_four_pods_without_an_annotation() -> None:
    # Clique a holds exactly the job's 4 pods x 4 GPUs; clique b has more room. A group of 4 takes the
    # best fit (a) and promises it for 4 pods; read as open-ended it would take the most room (b).
    cache: ClusterCache = cliques_cache({"a": 4, "b": 6})
    cache.replace("pytorchjobs", [pytorchjob("train", 3)])
    source = LiveSource(cache)
    policy = Policy()
    pod = worker("train", 0)
    decision = admit.mutate(pod, source.snapshot(), policy, namespace="team-a")
    assert decision.allowed and decision.allocation is not None, decision.message
    assert decision.allocation.domain == f"{CLIQUE}=a"
    mutated = jsonpatch.apply_patch(pod, [dict(op) for op in decision.patch])
    record = json.loads(mutated["metadata"]["annotations"]["gpu-admission.io/allocation"])
    assert record["domain"] == f"{CLIQUE}=a"
    # Validation as the server runs it: the group as the pod states it, sized by the source.
    group = placed_here(mutated, "team-a", policy)
    assert group is not None and group.size is None
    verdict = source.commit("train-0", "team-a",
                            lambda snapshot: admit.validate(mutated, snapshot, policy, namespace="team-a"), False,
                            group=group)
    assert verdict.allowed, verdict.message
    stored = source.groups.records()["team-a/pytorchjob/train"]
    assert (stored.size, stored.members, stored.promised_gpus) == (4, ("train-0",), 12)


def test_an_api_the_cluster_lacks_or_the_role_cannot_read_lists_empty() -> None:
    for status in (404, 403):
        lister: Any = refusing_lister(status)
        for kind in ("pytorchjobs", "volcanojobs", "podgroups"):
            assert [page["items"] for page in lister.list_pages(kind)] == [[]]
    lister = refusing_lister(403)  # the GPUInventory CRD unreadable is an error, as before
    try:
        list(lister.list_pages("gpuinventories"))
    except Exception as error:  # noqa: BLE001 - the lister's own refusal, checked below
        assert getattr(error, "status", None) == 403
    else:
        raise AssertionError("a refused GPUInventory list must fail")


def test_a_cluster_file_carries_the_owners_and_a_kubernetes_job_beside_them_states_nothing(tmp_path: Any) -> None:
    import yaml

    from webhook.cluster.files import load_cluster

    path = tmp_path / "cluster.yaml"
    batch_job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "team-a"},
                 "spec": {"parallelism": 5, "template": {"spec": {"containers": []}}}}
    path.write_text(yaml.safe_dump_all([clique_node("a-n0", "a"), pytorchjob("train", 3), PODGROUP, batch_job]))
    snapshot = build_snapshot(load_cluster([str(path)]))
    assert snapshot.group_sizes == {"team-a/pytorchjob/train": 4, "team-b/podgroup/pg": 3}
