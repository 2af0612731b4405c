"""The labels each controller puts on its pods, read back as the workload a pod belongs to, and the
webhook's admission log line carrying it."""

from __future__ import annotations

import json
import logging

import pytest
from server_support import fake_core, gpu_pod_review

from webhook.core.domain.decision import Decision
from webhook.core.domain.model import Snapshot
from webhook.core.podspec import workload
from webhook.policyfile.holder import PolicyHolder
from webhook.server.app import ServerConfig, create_app
from webhook.server.logs import JsonFormatter
from webhook.server.source import StaticSource


@pytest.mark.parametrize(
    ("family", "kind", "role", "index", "group", "labels", "described"),
    [
        ("training", "PyTorchJob", "Worker", 3, 1,
         {"training.kubeflow.org/job-name": "train", "training.kubeflow.org/replica-type": "worker",
          "training.kubeflow.org/replica-index": "3", "training.kubeflow.org/operator-name": "pytorchjob-controller"},
         "PyTorchJob train/worker/3"),
        ("mpi-v2", "MPIJob", "Launcher", 0, 1,
         {"training.kubeflow.org/job-name": "train", "training.kubeflow.org/job-role": "launcher",
          "training.kubeflow.org/replica-index": "0", "training.kubeflow.org/operator-name": "mpi-operator"},
         "MPIJob train/launcher/0"),
        ("jobset", "JobSet", "workers", 5, 2,
         {"jobset.sigs.k8s.io/jobset-name": "train", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
          "jobset.sigs.k8s.io/job-index": "2", "batch.kubernetes.io/job-name": "train-workers-2"},
         "JobSet train/workers/2"),
        ("lws", "LeaderWorkerSet", "leader", 1, 1,
         {"leaderworkerset.sigs.k8s.io/name": "train", "leaderworkerset.sigs.k8s.io/group-index": "1",
          "leaderworkerset.sigs.k8s.io/worker-index": "0"}, "LeaderWorkerSet train/1/0"),
        ("lws", "LeaderWorkerSet", "worker", 4, 3,  # size 4: workers 1..3 of each group
         {"leaderworkerset.sigs.k8s.io/name": "train", "leaderworkerset.sigs.k8s.io/group-index": "1",
          "leaderworkerset.sigs.k8s.io/worker-index": "2"}, "LeaderWorkerSet train/1/2"),
        ("lws", "LeaderWorkerSet", "leader+workers", 5, 4,  # no leaderTemplate: index 0 of a group is the leader
         {"leaderworkerset.sigs.k8s.io/name": "train", "leaderworkerset.sigs.k8s.io/group-index": "1",
          "leaderworkerset.sigs.k8s.io/worker-index": "1"}, "LeaderWorkerSet train/1/1"),
        ("ray", "RayCluster", "head", 0, 1,
         {"ray.io/cluster": "train", "ray.io/group": "headgroup", "ray.io/node-type": "head"},
         "RayCluster train/headgroup"),
        ("volcano", "Job", "worker", 1, 1,
         {"volcano.sh/job-name": "train", "volcano.sh/task-spec": "worker", "volcano.sh/task-index": "1"},
         "VolcanoJob train/worker/1"),
        ("job", "Job", "", 0, 1, {"batch.kubernetes.io/job-name": "train", "job-name": "train"}, "Job train"),
        ("kserve", "InferenceService", "predictor", 0, 1,
         {"serving.kserve.io/inferenceservice": "train", "component": "predictor"}, "InferenceService train/predictor"),
        ("argo", "Workflow", "step", 0, 1, {"workflows.argoproj.io/workflow": "train"}, "Workflow train"),
    ],
)
def test_pod_labels_read_back(family, kind, role, index, group, labels, described) -> None:
    made = workload.pod_labels(family, kind, "train", role, index, group)
    assert made == labels
    assert workload.describe(made) == described


def test_describe_ignores_unknown_and_non_string_labels() -> None:
    assert workload.describe(None) == ""
    assert workload.describe({"app": "web", "pod-template-hash": "abc"}) == ""
    assert workload.describe({"ray.io/cluster": 3}) == ""
    assert workload.pod_labels("", "Deployment", "web") == {}


def _log_entries(caplog: pytest.LogCaptureFixture, labels: dict[str, str] | None) -> dict[str, object]:
    data = gpu_pod_review(uid="w1")
    if labels is not None:
        data["request"]["object"]["metadata"]["labels"] = labels
    config = ServerConfig(source=StaticSource(Snapshot()), namespace="gpu-admission",
                          core=fake_core(lambda *a, **k: Decision(allowed=True)),
                          policy=PolicyHolder(None, loader=lambda _path: "the-policy"))
    with caplog.at_level(logging.INFO, logger="webhook.admission"):
        create_app(config).test_client().post("/mutate", data=json.dumps(data), content_type="application/json")
    [line] = [JsonFormatter().format(r) for r in caplog.records if r.name == "webhook.admission"]
    return json.loads(line)


def test_admission_log_line_names_the_workload(caplog: pytest.LogCaptureFixture) -> None:
    labels = workload.pod_labels("training", "PyTorchJob", "train", "Worker", 3)
    entry = _log_entries(caplog, {**labels, "app": "x"})
    assert entry["workload"] == "PyTorchJob train/worker/3"
    assert entry["pod"] == "train" and entry["verdict"] == "allowed"


def test_admission_log_line_of_a_plain_pod_has_no_workload_field(caplog: pytest.LogCaptureFixture) -> None:
    assert "workload" not in _log_entries(caplog, {"app": "x"})
