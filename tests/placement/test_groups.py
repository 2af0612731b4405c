"""Which group a pod belongs to (from the labels each controller really sets), the group record's JSON
form, and `commit`, the step the ledger runs to record a group member."""

from __future__ import annotations

import json

import pytest

from webhook.core.placement.groups import (
    GroupRecord,
    GroupRef,
    commit,
    domain_of,
    group_of,
    promised_in,
    record_from_json,
    record_to_json,
    without_member,
)


def pod(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, object]:
    return {"metadata": {"name": "p", "labels": labels or {}, "annotations": annotations or {}}, "spec": {}}


def labels_of(manifest: dict[str, object]) -> dict[str, str]:
    return dict(manifest["metadata"]["labels"])  # type: ignore[index]


# Label and annotation sets as each controller writes them on the pods it creates (constants read from
# kubernetes-sigs/lws api/leaderworkerset/v1, kubernetes-sigs/jobset jobset_controller.go
# labelAndAnnotateObject, kubeflow training-operator common labels, kuberay utils, volcano createJobPod,
# scheduler-plugins coscheduling).
LWS_WORKER = pod(
    {"leaderworkerset.sigs.k8s.io/name": "vllm", "leaderworkerset.sigs.k8s.io/group-index": "1",
     "leaderworkerset.sigs.k8s.io/worker-index": "2", "leaderworkerset.sigs.k8s.io/group-key": "5f1c0e",
     "leaderworkerset.sigs.k8s.io/template-revision-hash": "7d9b"},
    {"leaderworkerset.sigs.k8s.io/size": "4", "leaderworkerset.sigs.k8s.io/leader-name": "vllm-1"})
LWS_LEADER = pod(
    {"leaderworkerset.sigs.k8s.io/name": "vllm", "leaderworkerset.sigs.k8s.io/group-index": "1",
     "leaderworkerset.sigs.k8s.io/worker-index": "0", "leaderworkerset.sigs.k8s.io/group-key": "5f1c0e"},
    {"leaderworkerset.sigs.k8s.io/size": "4"})
JOBSET_WORKER = pod(
    {"jobset.sigs.k8s.io/jobset-name": "pytorch", "jobset.sigs.k8s.io/jobset-uid": "0b7c",
     "jobset.sigs.k8s.io/replicatedjob-name": "workers", "jobset.sigs.k8s.io/replicatedjob-replicas": "2",
     "jobset.sigs.k8s.io/global-replicas": "2", "jobset.sigs.k8s.io/job-index": "1",
     "jobset.sigs.k8s.io/job-global-index": "1", "jobset.sigs.k8s.io/job-key": "a1b2",
     "jobset.sigs.k8s.io/restart-attempt": "0", "batch.kubernetes.io/job-name": "pytorch-workers-1",
     "batch.kubernetes.io/job-completion-index": "0"},
    {"jobset.sigs.k8s.io/jobset-name": "pytorch", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
     "jobset.sigs.k8s.io/replicatedjob-replicas": "2", "batch.kubernetes.io/job-completion-index": "0"})
PYTORCH_MASTER = pod({"training.kubeflow.org/job-name": "train", "training.kubeflow.org/replica-type": "master",
                      "training.kubeflow.org/replica-index": "0", "training.kubeflow.org/job-role": "master",
                      "training.kubeflow.org/operator-name": "pytorchjob-controller"})
PYTORCH_WORKER = pod({"training.kubeflow.org/job-name": "train", "training.kubeflow.org/replica-type": "worker",
                      "training.kubeflow.org/replica-index": "2",
                      "training.kubeflow.org/operator-name": "pytorchjob-controller"})
TFJOB_WORKER = pod({"training.kubeflow.org/job-name": "train", "training.kubeflow.org/replica-type": "worker",
                    "training.kubeflow.org/replica-index": "0",
                    "training.kubeflow.org/operator-name": "tfjob-controller"})
MPI_WORKER = pod({"training.kubeflow.org/job-name": "bench", "training.kubeflow.org/job-role": "worker",
                  "training.kubeflow.org/replica-index": "0", "training.kubeflow.org/operator-name": "mpi-operator"})
RAY_WORKER = pod({"ray.io/cluster": "verl", "ray.io/group": "gpu-group", "ray.io/node-type": "worker",
                  "ray.io/identifier": "verl-worker", "ray.io/is-ray-node": "yes",
                  "app.kubernetes.io/name": "kuberay", "app.kubernetes.io/created-by": "kuberay-operator"})
VOLCANO_WORKER = pod(
    {"volcano.sh/job-name": "mindspore", "volcano.sh/job-namespace": "ml", "volcano.sh/queue-name": "default",
     "volcano.sh/task-spec": "worker"},
    {"scheduling.k8s.io/group-name": "mindspore", "volcano.sh/job-name": "mindspore",
     "volcano.sh/task-spec": "worker", "volcano.sh/task-index": "0", "volcano.sh/job-version": "0"})
PODGROUP_MEMBER = pod({"scheduling.x-k8s.io/pod-group": "nginx"})
LEGACY_PODGROUP = pod({"pod-group.scheduling.sigs.k8s.io/name": "nginx",
                       "pod-group.scheduling.sigs.k8s.io/min-available": "3"})


@pytest.mark.parametrize(
    ("manifest", "name", "size", "minimum", "source"),
    [
        (LWS_WORKER, "lws/vllm/1", 4, 4, "leaderworkerset.sigs.k8s.io/name"),
        (LWS_LEADER, "lws/vllm/1", 4, 4, "leaderworkerset.sigs.k8s.io/name"),
        (JOBSET_WORKER, "jobset/pytorch/workers", None, 2, "jobset.sigs.k8s.io/jobset-name"),
        (PYTORCH_MASTER, "pytorchjob/train", None, 1, "training.kubeflow.org/job-name"),
        (PYTORCH_WORKER, "pytorchjob/train", None, 1, "training.kubeflow.org/job-name"),
        (TFJOB_WORKER, "tfjob/train", None, 1, "training.kubeflow.org/job-name"),
        (MPI_WORKER, "mpi-operator/bench", None, 1, "training.kubeflow.org/job-name"),
        (RAY_WORKER, "raycluster/verl/gpu-group", None, 1, "ray.io/cluster"),
        (VOLCANO_WORKER, "vcjob/mindspore", None, 1, "volcano.sh/job-name"),
        (PODGROUP_MEMBER, "podgroup/nginx", None, 1, "scheduling.x-k8s.io/pod-group"),
        (LEGACY_PODGROUP, "podgroup/nginx", None, 3, "pod-group.scheduling.sigs.k8s.io/name"),
    ],
)
def test_controller_labels_name_the_group(manifest: dict[str, object], name: str, size: int | None,
                                          minimum: int, source: str) -> None:
    ref = group_of(manifest, "ml")
    assert ref == GroupRef("ml", name, size, source, minimum)
    assert ref is not None and ref.key == f"ml/{name}"


def test_leader_and_workers_of_one_lws_group_share_it_and_other_groups_do_not() -> None:
    other = pod({**labels_of(LWS_WORKER), "leaderworkerset.sigs.k8s.io/group-index": "2"},
                {"leaderworkerset.sigs.k8s.io/size": "4"})
    assert group_of(LWS_LEADER, "ml") == group_of(LWS_WORKER, "ml")
    ref = group_of(other, "ml")
    assert ref is not None and ref.name == "lws/vllm/2"


def test_group_annotation_wins_and_size_annotation_states_the_size() -> None:
    ref = group_of(pod(labels_of(PYTORCH_WORKER),
                       {"gpu-admission.io/group": "train", "gpu-admission.io/group-size": "4"}), "ml")
    assert ref == GroupRef("ml", "train", 4, "gpu-admission.io/group", 4)
    sized = group_of(pod(labels_of(JOBSET_WORKER), {"gpu-admission.io/group-size": "8"}), "ml")
    assert sized == GroupRef("ml", "jobset/pytorch/workers", 8, "jobset.sigs.k8s.io/jobset-name", 8)
    assert group_of(pod(annotations={"gpu-admission.io/group": "solo"}), "ml") == GroupRef(
        "ml", "solo", None, "gpu-admission.io/group", 1)


def test_pods_of_no_group_and_controllers_that_run_single_pods() -> None:
    assert group_of(pod(), "ml") is None
    assert group_of({}, "ml") is None
    assert group_of(pod({"batch.kubernetes.io/job-name": "one", "job-name": "one"}), "ml") is None
    assert group_of(pod({"serving.kserve.io/inferenceservice": "llm", "component": "predictor"}), "ml") is None


@pytest.mark.parametrize(
    ("annotations", "field"),
    [
        ({"gpu-admission.io/group-size": "0"}, "gpu-admission.io/group-size"),
        ({"gpu-admission.io/group-size": "four"}, "gpu-admission.io/group-size"),
        ({"gpu-admission.io/group-size": "-2"}, "gpu-admission.io/group-size"),
        ({"gpu-admission.io/group-size": 4}, "gpu-admission.io/group-size"),
        ({"gpu-admission.io/group": ""}, "gpu-admission.io/group"),
        ({"gpu-admission.io/group": ["a"]}, "gpu-admission.io/group"),
    ],
)
def test_malformed_group_annotations_are_errors_naming_the_annotation(annotations: dict[str, object],
                                                                      field: str) -> None:
    with pytest.raises(ValueError, match=f"metadata.annotations\\[{field}\\]"):
        group_of({"metadata": {"annotations": annotations}}, "ml")


def test_a_controller_count_that_is_not_a_number_leaves_the_group_open_ended() -> None:
    ref = group_of(pod(labels_of(LWS_WORKER), {"leaderworkerset.sigs.k8s.io/size": "x"}), "ml")
    assert ref is not None and ref.size is None and ref.minimum == 1


RECORD = GroupRecord("ml", "pytorchjob/train", "nvidia.com/gpu.clique", "c1", 4, 8, ("uid-a", "uid-b"))


def test_record_json_round_trip() -> None:
    data = record_to_json(RECORD)
    assert data == {"namespace": "ml", "name": "pytorchjob/train", "level": "nvidia.com/gpu.clique",
                    "domain": "c1", "size": 4, "gpusPerPod": 8, "members": ["uid-a", "uid-b"]}
    assert record_from_json(json.loads(json.dumps(data))) == RECORD
    open_ended = GroupRecord("ml", "x", "topology.kubernetes.io/rack", "r1", None, 2, ())
    assert record_from_json(record_to_json(open_ended)) == open_ended
    assert RECORD.promised_gpus == 16 and open_ended.promised_gpus == 0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"size": 0}, "size"), ({"size": True}, "size"), ({"size": "4"}, "size"),
        ({"gpusPerPod": -1}, "gpusPerPod"), ({"gpusPerPod": None}, "gpusPerPod"),
        ({"members": "uid-a"}, "members"), ({"members": [1]}, "members"),
        ({"domain": ""}, "domain"), ({"level": 3}, "level"), ({"namespace": None}, "namespace"),
        ({"name": ""}, "name"),
    ],
)
def test_record_json_errors_name_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        record_from_json({**record_to_json(RECORD), **change})


def test_record_from_json_refuses_what_is_not_an_object() -> None:
    with pytest.raises(ValueError, match="expected a JSON object"):
        record_from_json(["ml"])


REF_A = GroupRef("ml", "a", 2, "gpu-admission.io/group", 2)
REF_B = GroupRef("ml", "b", 2, "gpu-admission.io/group", 2)
CLIQUE = "nvidia.com/gpu.clique"


def test_commit_creates_then_extends_the_record_idempotently() -> None:
    first = commit({}, REF_A, CLIQUE, "c1", 8, "uid-2", free=16)
    assert first == GroupRecord("ml", "a", CLIQUE, "c1", 2, 8, ("uid-2",))
    assert isinstance(first, GroupRecord) and first.promised_gpus == 8
    second = commit({first.key: first}, REF_A, CLIQUE, "c1", 8, "uid-1", free=8)
    assert second == GroupRecord("ml", "a", CLIQUE, "c1", 2, 8, ("uid-1", "uid-2"))
    assert commit({first.key: second}, REF_A, CLIQUE, "c1", 8, "uid-1", free=0) == second  # a retry


def test_commit_refuses_a_member_placed_outside_its_groups_domain() -> None:
    first = commit({}, REF_A, CLIQUE, "c1", 8, "uid-1")
    assert isinstance(first, GroupRecord)
    refusal = commit({first.key: first}, REF_A, CLIQUE, "c2", 8, "uid-2")
    assert refusal == "group ml/a lives in nvidia.com/gpu.clique=c1; this pod was placed in nvidia.com/gpu.clique=c2"


def test_two_groups_racing_for_the_last_domain_one_waits() -> None:
    # 16 GPUs free in c1; each group needs 2 pods x 8. A commits first; its second pod is still to come.
    a = commit({}, REF_A, CLIQUE, "c1", 8, "a-0", free=16)
    assert isinstance(a, GroupRecord)
    records = {a.key: a}
    refusal = commit(records, REF_B, CLIQUE, "c1", 8, "b-0", free=8)  # a-0's GPUs are taken
    assert refusal == ("group ml/b needs 16 GPUs in nvidia.com/gpu.clique=c1: 8 are free and "
                       "other groups' pods still to come hold 8 of them")
    assert promised_in(records, CLIQUE, "c1") == 8 and promised_in(records, CLIQUE, "c1", besides=a.key) == 0
    # A's second pod still fits: its own promise covers it
    done = commit(records, REF_A, CLIQUE, "c1", 8, "a-1", free=8)
    assert isinstance(done, GroupRecord) and done.promised_gpus == 0
    # Once A is whole, B gets a domain that has room again
    assert isinstance(commit({a.key: done}, REF_B, CLIQUE, "c1", 8, "b-0", free=16), GroupRecord)
    # another domain is no concern of A's promise
    assert isinstance(commit(records, REF_B, CLIQUE, "c2", 8, "b-0", free=16), GroupRecord)


OTHER = GroupRecord("ml", "other", CLIQUE, "c1", 2, 4, ("o-0",))  # expects 4 more GPUs in c1


def test_commit_of_an_open_ended_group_needs_room_for_its_minimum_beside_other_promises() -> None:
    jobset = GroupRef("ml", "jobset/js/w", None, "jobset.sigs.k8s.io/jobset-name", 3)
    records = {OTHER.key: OTHER}
    assert isinstance(commit(records, jobset, CLIQUE, "c1", 4, "p0", free=16), GroupRecord)
    assert commit(records, jobset, CLIQUE, "c1", 4, "p0", free=15) == (
        "group ml/jobset/js/w needs 12 GPUs in nvidia.com/gpu.clique=c1: 15 are free and other groups' pods "
        "still to come hold 4 of them")


def test_a_group_may_wait_for_a_busy_domain_nobody_else_was_promised() -> None:
    created = commit({}, REF_A, CLIQUE, "c1", 8, "a-0", free=0)
    assert isinstance(created, GroupRecord) and created.members == ("a-0",)


def test_members_beyond_the_stated_size_need_free_gpus_of_their_own() -> None:
    full = GroupRecord("ml", "a", CLIQUE, "c1", 2, 8, ("a-0", "a-1"))
    records = {full.key: full, OTHER.key: OTHER}
    assert commit(records, REF_A, CLIQUE, "c1", 8, "a-2", free=8) == (
        "group ml/a needs 8 GPUs in nvidia.com/gpu.clique=c1: 8 are free and other groups' pods still to "
        "come hold 4 of them")
    grown = commit(records, REF_A, CLIQUE, "c1", 8, "a-2", free=12)
    assert isinstance(grown, GroupRecord) and grown.members == ("a-0", "a-1", "a-2")
    within = commit({OTHER.key: OTHER, REF_A.key: GroupRecord("ml", "a", CLIQUE, "c1", 2, 8, ("a-0",))},
                    REF_A, CLIQUE, "c1", 8, "a-1", free=4)  # its own promise covers it
    assert isinstance(within, GroupRecord) and within.members == ("a-0", "a-1")


def test_without_member_releases_the_domain_when_the_last_member_goes() -> None:
    left = without_member(RECORD, "uid-a")
    assert left is not None and left.members == ("uid-b",) and left.promised_gpus == 24
    assert without_member(left, "uid-b") is None
    assert without_member(RECORD, "uid-x") == RECORD


def test_domain_of_splits_the_allocation_domain() -> None:
    assert domain_of("nvidia.com/gpu.clique=c1") == ("nvidia.com/gpu.clique", "c1")
    assert domain_of("topology.kubernetes.io/rack=r=1") == ("topology.kubernetes.io/rack", "r=1")
    assert domain_of("") is None and domain_of("c1") is None and domain_of("=c1") is None
