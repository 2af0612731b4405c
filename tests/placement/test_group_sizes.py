"""A group's size read from its controller's object or PodGroup (`groups.sizes_of`), used by `group_of`
when the pod states none, and by the first pod's choice of a domain."""

from __future__ import annotations

from typing import Any

from webhook.core.placement.groups import group_of, merge_sizes, sizes_of


def pod(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "labels": labels or {}, "annotations": annotations or {}}, "spec": {}}


def template(gpus: int = 1) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


PYTORCHJOB = {
    "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "train", "namespace": "ml"},
    "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template()},
                                     "Worker": {"replicas": 3, "template": template()}}},
}
PYTORCH_POD = pod({"training.kubeflow.org/job-name": "train", "training.kubeflow.org/replica-type": "worker",
                   "training.kubeflow.org/replica-index": "0",
                   "training.kubeflow.org/operator-name": "pytorchjob-controller"})


def test_a_pytorchjob_states_master_and_workers_as_one_group_of_four() -> None:
    sizes = sizes_of(PYTORCHJOB)
    assert sizes == {"ml/pytorchjob/train": 4}
    ref = group_of(PYTORCH_POD, "ml", sizes)
    assert ref is not None and (ref.key, ref.size, ref.minimum) == ("ml/pytorchjob/train", 4, 4)
    assert group_of(PYTORCH_POD, "ml").size is None  # type: ignore[union-attr]  # without: open-ended


def test_the_pods_own_size_annotation_wins_and_a_named_group_is_not_sized_by_a_controller() -> None:
    sizes = sizes_of(PYTORCHJOB)
    stated = pod(PYTORCH_POD["metadata"]["labels"], {"gpu-admission.io/group-size": "2"})
    assert group_of(stated, "ml", sizes).size == 2  # type: ignore[union-attr]
    named = pod(PYTORCH_POD["metadata"]["labels"], {"gpu-admission.io/group": "pytorchjob/train"})
    assert group_of(named, "ml", sizes).size is None  # type: ignore[union-attr]
    assert group_of(PYTORCH_POD, "other", sizes).size is None  # type: ignore[union-attr]  # another namespace


def test_a_volcano_podgroup_states_min_member_for_the_pods_that_name_it() -> None:
    podgroup = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                "metadata": {"name": "pg1", "namespace": "ml"}, "spec": {"minMember": 6, "queue": "default"}}
    sizes = sizes_of(podgroup)
    assert sizes == {"ml/podgroup/pg1": 6}
    member = pod({}, {"scheduling.k8s.io/group-name": "pg1"})
    ref = group_of(member, "ml", sizes)
    assert ref is not None and (ref.name, ref.size) == ("podgroup/pg1", 6)
    plugins = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
               "metadata": {"name": "pg2", "namespace": "ml"}, "spec": {"minMember": 3}}
    labelled = pod({"scheduling.x-k8s.io/pod-group": "pg2"})
    assert group_of(labelled, "ml", sizes_of(plugins)).size == 3  # type: ignore[union-attr]


def test_a_volcano_job_pod_stays_in_its_job_group_sized_by_all_its_tasks() -> None:
    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "mpi", "namespace": "ml"},
           "spec": {"minAvailable": 2, "tasks": [{"name": "master", "replicas": 1, "template": template()},
                                                 {"name": "worker", "replicas": 4, "template": template()}]}}
    assert sizes_of(job) == {"ml/vcjob/mpi": 5}
    member = pod({"volcano.sh/job-name": "mpi", "volcano.sh/task-spec": "worker"},
                 {"scheduling.k8s.io/group-name": "mpi-0b7c"})
    assert group_of(member, "ml", sizes_of(job)).name == "vcjob/mpi"  # type: ignore[union-attr]
    assert sizes_of({**job, "apiVersion": "batch/v1"}) == {}  # a Kubernetes Job states no group


def test_a_jobset_states_replicas_times_parallelism_per_replicated_job() -> None:
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js", "namespace": "ml"},
              "spec": {"replicatedJobs": [
                  {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 4, "completions": 4}}},
                  {"name": "driver", "template": {"spec": {}}}]}}
    sizes = sizes_of(jobset)
    assert sizes == {"ml/jobset/js/workers": 8, "ml/jobset/js/driver": 1}
    member = pod({"jobset.sigs.k8s.io/jobset-name": "js", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                  "jobset.sigs.k8s.io/replicatedjob-replicas": "2"})
    ref = group_of(member, "ml", sizes)
    assert ref is not None and (ref.size, ref.minimum) == (8, 8)
    assert group_of(member, "ml").size is None  # type: ignore[union-attr]  # from the pod alone: 2 Jobs at least


def test_raycluster_mpijob_and_malformed_counts() -> None:
    ray = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc", "namespace": "ml"},
           "spec": {"headGroupSpec": {"template": template()},
                    "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "numOfHosts": 4, "template": template()},
                                         {"groupName": "small", "minReplicas": 3, "template": template()}]}}
    assert sizes_of(ray) == {"ml/raycluster/rc/headgroup": 1, "ml/raycluster/rc/gpu": 8, "ml/raycluster/rc/small": 3}
    head = pod({"ray.io/cluster": "rc", "ray.io/group": "headgroup", "ray.io/node-type": "head"})
    assert group_of(head, "ml", sizes_of(ray)).size == 1  # type: ignore[union-attr]
    mpi = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "m", "namespace": "ml"},
           "spec": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 4}}}}
    assert sizes_of(mpi) == {"ml/mpi-operator/m": 4}  # the launcher holds no part of the job's GPUs
    assert sizes_of({**mpi, "spec": {**mpi["spec"], "runLauncherAsWorker": True}}) == {"ml/mpi-operator/m": 5}
    bad = {**PYTORCHJOB, "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": "3"}}}}
    assert sizes_of(bad) == {}
    assert sizes_of({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}) == {}
    assert merge_sizes([{"ml/podgroup/a": 2}, {"ml/podgroup/a": 5, "ml/podgroup/b": 1}]) == {
        "ml/podgroup/a": 5, "ml/podgroup/b": 1}
