"""Workload kinds -> pod templates: every public fixture and hand-written manifest of each kind, by role and count."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from webhook.core.podspec.resources import parse_pod
from webhook.errors import UserError
from webhook.manifests import Document, Problem, load_documents, read_all
from webhook.workloads import Context, Skipped, Workload, context, pod_templates, workloads

FIXTURES = Path(__file__).parent.parent / "fixtures" / "workloads"
PUBLIC, WRITTEN = FIXTURES / "public", FIXTURES / "written"
TORCHTUNE = PUBLIC / "trainer-manifests-base-runtimes-torchtune-llama3_2-llama3_2_1B.yaml"

VOLCANO_IN_ARGO = "submit-volcano-job: Job (batch.volcano.sh) argo-parameter "  # {{...}} name: a placeholder
# file -> per result: (kind, name, role, pods, GPUs per pod) | ("skip", kind) | ("error", kind, field)
PUBLIC_EXPECTED: dict[str, list[tuple[Any, ...]]] = {
    "jobset-site-static-examples-argo-workflow-workflow.yaml": [
        ("Workflow", "argo-workflow-jobset-", "jobset-example: JobSet paralleljobs workers", 4, 0),
        ("Workflow", "argo-workflow-jobset-", "jobset-example: JobSet paralleljobs driver", 1, 0),
    ],
    "jobset-site-static-examples-pytorch-cnn-mnist-mnist.yaml": [("JobSet", "pytorch", "workers", 4, 0)],
    "jobset-site-static-examples-pytorch-resnet-cifar10-resnet.yaml": [("JobSet", "pytorch", "workers", 4, 0)],
    "jobset-site-static-examples-workload-aware-scheduling-dra-jobset.yaml": [
        ("JobSet", "training-job", "workers", 6, 0)  # its GPUs come through a DRA ResourceClaimTemplate
    ],
    "kserve-docs-samples-accelerators-tensorflow-gpu.yaml": [("InferenceService", "tensorflow-gpu", "predictor", 1, 1)],
    "kserve-docs-samples-autoscaling-autoscale_gpu.yaml": [
        ("InferenceService", "flowers-sample-gpu", "predictor", 1, 1)
    ],
    "kserve-docs-samples-llmisvc-single-node-gpu-llm-inference-service-qwen2-7b-gpu-no-scheduler.yaml": [
        ("LLMInferenceService", "qwen2-7b-instruct-single-no-scheduler", "workload", 3, 1)
    ],
    "kuberay-ray-operator-config-samples-pytorch-resnet-image-classifier-ray-job.pytorch-image-classifier.yaml": [
        ("RayJob", "pytorch-image-classifier-", "head", 1, 0),
        ("RayJob", "pytorch-image-classifier-", "gpu-group", 4, 1),
    ],
    "kuberay-ray-operator-config-samples-pytorch-text-classifier-ray-job.pytorch-distributed-training.yaml": [
        ("RayJob", "pytorch-text-classifier-", "head", 1, 1)
    ],
    "kuberay-ray-operator-config-samples-ray-cluster.verl.yaml": [("RayCluster", "verl-cluster", "head", 1, 4)],
    "kuberay-ray-operator-config-samples-ray-job.batch-inference.yaml": [
        ("RayJob", "rayjob-sample", "head", 1, 4),
        ("skip", "ConfigMap"),
    ],
    "kuberay-ray-operator-config-samples-ray-service.deepseek.yaml": [
        ("RayService", "deepseek-r1", "head", 1, 0),
        ("RayService", "deepseek-r1", "gpu-group", 2, 8),
    ],
    "kuberay-ray-operator-config-samples-ray-service.high-throughput-gemma4.yaml": [
        ("RayService", "ray-gemma4-e2b-it", "head", 1, 0),
        ("RayService", "ray-gemma4-e2b-it", "gpu-group", 1, 8),
    ],
    "kuberay-ray-operator-config-samples-ray-service.high-throughput-llm.yaml": [
        ("RayService", "qwen-35-4b", "head", 1, 0),
        ("RayService", "qwen-35-4b", "gpu-group", 4, 1),
    ],
    "kuberay-ray-operator-config-samples-ray-service.llm-serve.yaml": [
        ("RayService", "ray-serve-llm", "head", 1, 0),
        ("RayService", "ray-serve-llm", "gpu-group", 1, 4),
        ("skip", "Secret"),
    ],
    "kuberay-ray-operator-config-samples-ray-service.stable-diffusion.yaml": [
        ("RayService", "stable-diffusion", "head", 1, 0),
        ("RayService", "stable-diffusion", "gpu-group", 1, 1),
    ],
    "kuberay-ray-operator-config-samples-ray-service.text-summarizer.yaml": [
        ("RayService", "text-summarizer", "head", 1, 0),
        ("RayService", "text-summarizer", "gpu-group", 1, 1),
    ],
    "lws-docs-examples-sglang-lws.yaml": [
        ("LeaderWorkerSet", "sglang", "leader", 2, 1),
        ("LeaderWorkerSet", "sglang", "worker", 2, 1),
        ("skip", "Service"),
    ],
    "lws-docs-examples-tensorrt-llm-lws.yaml": [
        ("LeaderWorkerSet", "tensorrt", "leader", 1, 8),
        ("LeaderWorkerSet", "tensorrt", "worker", 1, 8),
        ("skip", "Service"),
    ],
    "lws-docs-examples-vllm-GPU-lws.yaml": [
        ("LeaderWorkerSet", "vllm", "leader", 2, 8),
        ("LeaderWorkerSet", "vllm", "worker", 2, 8),
        ("skip", "Service"),
    ],
    "mpi-operator-examples-v2beta1-tensorflow-benchmarks-tensorflow-benchmarks.yaml": [
        ("MPIJob", "tensorflow-benchmarks", "Launcher", 1, 0),
        ("MPIJob", "tensorflow-benchmarks", "Worker", 2, 1),
    ],
    # names a runtime that is not in the input: an input error, never a pass
    "trainer-examples-flux-lammps-train-gpus.yaml": [("error", "TrainJob", "spec.runtimeRef")],
    "trainer-hack-gpu-time-slicing.yml": [("skip", "ConfigMap")],
    "trainer-manifests-base-runtimes-torchtune-llama3_2-llama3_2_1B.yaml": [("skip", "ClusterTrainingRuntime")],
    "training-operator-v1-examples-paddlepaddle-simple-gpu.yaml": [("PaddleJob", "paddle-simple-gpu", "Worker", 2, 2)],
    "training-operator-v1-examples-pytorch-deepspeed-demo-pytorch_deepspeed_demo.yaml": [
        ("PyTorchJob", "pytorch-deepspeed-demo", "Master", 1, 1),
        ("PyTorchJob", "pytorch-deepspeed-demo", "Worker", 1, 1),
    ],
    "training-operator-v1-examples-pytorch-mnist-v1-pytorch_job_mnist_gloo.yaml": [
        ("PyTorchJob", "pytorch-dist-mnist-gloo", "Master", 1, 1),
        ("PyTorchJob", "pytorch-dist-mnist-gloo", "Worker", 1, 1),
    ],
    "training-operator-v1-examples-pytorch-mnist-v1-pytorch_job_mnist_nccl.yaml": [
        ("PyTorchJob", "pytorch-dist-mnist-nccl", "Master", 1, 1),
        ("PyTorchJob", "pytorch-dist-mnist-nccl", "Worker", 1, 1),
    ],
    "training-operator-v1-examples-tensorflow-distribution_strategy-multi_worker_tfjob.yaml": [
        ("TFJob", "multi-worker", "Worker", 2, 1)
    ],
    "volcano-example-MindSpore-example-mindspore_gpu-mindspore-gpu.yaml": [
        ("Job", "mindspore-gpu", "mpimaster", 1, 0),
        ("Job", "mindspore-gpu", "mpiworker", 2, 1),
    ],
    "volcano-example-integrations-argo-mpi-hello-world.yaml": [
        ("WorkflowTemplate", "volcano-mpi-hello", "follow-master-logs", 1, 0),
        ("WorkflowTemplate", "volcano-mpi-hello", VOLCANO_IN_ARGO + "mpimaster", 1, 0),
        ("WorkflowTemplate", "volcano-mpi-hello", VOLCANO_IN_ARGO + "mpiworker", 2, 0),
    ],
    "argo-workflows-examples-init-container.yaml": [("Workflow", "init-container-", "init-container-example", 1, 0)],
    "argo-workflows-examples-pod-spec-patch-wf-tmpl.yaml": [("Workflow", "pod-spec-patch-", "hello-world", 1, 0)],
    "argo-workflows-examples-sidecar.yaml": [("Workflow", "sidecar-", "sidecar-example", 1, 0)],
    "k8s-nim-operator-config-samples-nim-serving-advanced-multi-node-multi-node-nimservice.yaml": [
        ("skip", "NIMCache"),
        ("NIMService", "deepseek-r1", "leader", 1, 8),  # pipeline 2: a LeaderWorkerSet of 2 pods per replica
        ("NIMService", "deepseek-r1", "worker", 1, 8),
    ],
    "k8s-nim-operator-config-samples-nim-serving-standalone-autoscaling-llm.yaml": [
        ("skip", "NIMCache"),
        ("NIMService", "meta-llama-3-2-1b-instruct", "", 1, 1),  # scale.hpa.minReplicas
    ],
    "k8s-nim-operator-config-samples-nim-serving-standalone-basic-llm.yaml": [
        ("skip", "NIMCache"),
        ("NIMService", "meta-llama-3-2-1b-instruct", "", 1, 1),
    ],
    "production-stack-operator-config-samples-production-stack_v1alpha1_vllmruntime.yaml": [
        ("VLLMRuntime", "vllmruntime-sample", "", 2, 1),
    ],
    "production-stack-operator-config-samples-production-stack_v1alpha1_vllmruntime_autoscaling.yaml": [
        ("VLLMRuntime", "vllmruntime-autoscaling-minimal", "", 1, 1),
        ("VLLMRuntime", "vllmruntime-autoscaling-scale-to-zero", "", 1, 1),  # replicas 1 within 0..2
        ("VLLMRuntime", "vllmruntime-autoscaling-sample", "", 1, 1),
    ],
    "spark-operator-examples-spark-pi.yaml": [
        ("SparkApplication", "spark-pi", "driver", 1, 0),
        ("SparkApplication", "spark-pi", "executor", 1, 0),
    ],
    "spark-operator-examples-spark-pi-dynamic-allocation.yaml": [
        ("SparkApplication", "spark-pi-dynamic-allocation", "driver", 1, 0),
        ("SparkApplication", "spark-pi-dynamic-allocation", "executor", 2, 0),  # initialExecutors
    ],
    "spark-operator-examples-spark-pi-scheduled.yaml": [
        ("ScheduledSparkApplication", "spark-pi-scheduled", "driver", 1, 0),
        ("ScheduledSparkApplication", "spark-pi-scheduled", "executor", 1, 0),
    ],
    "katib-examples-nas-darts-gpu.yaml": [("Experiment", "darts-gpu", "trial 1/1: Job", 1, 1)],
    "katib-examples-kubeflow-training-operator-pytorchjob-mnist.yaml": [
        ("Experiment", "pytorchjob-mnist", f"trial {n}/3: PyTorchJob {role}", 1, 0)
        for n in (1, 2, 3) for role in ("Master", "Worker")
    ],
    # its trial template is in a ConfigMap of Katib's manifests, not in this file: an input error
    "katib-examples-trial-template-trial-configmap-source.yaml": [
        ("error", "Experiment", "spec.trialTemplate.configMap")
    ],
    "katib-manifests-v1beta1-components-controller-trial-templates.yaml": [("skip", "ConfigMap")],
}

# (files...) -> expected results, for the manifests written from each project's documented API
WRITTEN_EXPECTED: dict[tuple[str, ...], list[tuple[Any, ...]]] = {
    ("pytorchjob-train.yaml",): [("PyTorchJob", "train", "Master", 1, 1), ("PyTorchJob", "train", "Worker", 4, 1)],
    ("xgboostjob.yaml",): [
        ("XGBoostJob", "xgboost-dist-iris", "Master", 1, 0),
        ("XGBoostJob", "xgboost-dist-iris", "Worker", 2, 1),
    ],
    ("jaxjob.yaml",): [("JAXJob", "jaxjob-simple", "Worker", 2, 2)],
    ("trainjob-with-runtime.yaml",): [
        ("skip", "ClusterTrainingRuntime"),
        ("TrainJob", "fine-tune", "model-initializer", 1, 0),
        ("TrainJob", "fine-tune", "node", 3, 2),  # numNodes 3 and resourcesPerNode 2 GPUs override the runtime
    ],
    ("trainjob-torchtune.yaml", str(TORCHTUNE)): [
        ("TrainJob", "tune-llama", "dataset-initializer", 1, 0),
        ("TrainJob", "tune-llama", "model-initializer", 1, 0),
        ("TrainJob", "tune-llama", "node", 1, 2),  # the runtime's numNodes and container
        ("skip", "ClusterTrainingRuntime"),
    ],
    ("volcano-job-gpu.yaml",): [
        ("Job", "tf-dist", "ps", 1, 0),
        ("Job", "tf-dist", "worker", 3, 2),
        ("Job", "eval", "", 2, 1),
    ],
    ("argo-workflows.yaml",): [
        ("Workflow", "train-eval-", "train", 1, 2),
        ("Workflow", "train-eval-", "report", 1, 0),
        ("Workflow", "train-eval-", "pack", 1, 0),
        ("CronWorkflow", "nightly-eval", "eval", 1, 1),
    ],
    ("walked-custom-kinds.yaml",): [
        ("Notebook", "lab", "spec.template", 1, 1),
        ("ModelServer", "llama", "spec.engine.template", 2, 1),
        ("Benchmark", "gemm", "spec.runner", 1, 4),
        ("skip", "Dashboard"),
    ],
    ("kserve-model-and-lws.yaml",): [
        ("InferenceService", "llama", "predictor", 2, 1),
        ("InferenceService", "llama", "transformer", 1, 0),
        ("LeaderWorkerSet", "mesh", "leader+workers", 6, 1),
        ("RayCluster", "tpu-like", "head", 1, 0),
        ("RayCluster", "tpu-like", "gpu", 2, 1),  # autoscaled: minReplicas 1 x numOfHosts 2
    ],
    ("mixed-good-and-broken.yaml",): [
        ("Pod", "ok", "", 1, 1),
        ("error", "Deployment", "spec.replicas"),
        ("error", "", ""),
        ("error", "TrainJob", "spec.runtimeRef"),
        ("skip", "Service"),
        ("skip", "Namespace"),
        ("Job", "vc", "worker", 1, 1),
    ],
}


def summarise(results: list[Any]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for r in results:
        if isinstance(r, Workload):
            rows.append((r.kind, r.name, r.role, r.replicas, parse_pod(r.pod).gpus))
        elif isinstance(r, Skipped):
            rows.append(("skip", r.kind))
        else:
            assert isinstance(r, Problem)
            rows.append(("error", r.kind, r.field))
    return rows


def test_every_public_fixture_is_covered() -> None:
    assert sorted(p.name for p in PUBLIC.iterdir() if p.suffix in (".yaml", ".yml")) == sorted(PUBLIC_EXPECTED)
    assert len(PUBLIC_EXPECTED) == 46


@pytest.mark.parametrize("name", sorted(PUBLIC_EXPECTED))
def test_public_fixture_pod_templates(name: str) -> None:
    assert summarise(workloads(read_all([str(PUBLIC / name)]))) == PUBLIC_EXPECTED[name]


@pytest.mark.parametrize("files", sorted(WRITTEN_EXPECTED), ids=lambda files: files[0])
def test_written_fixture_pod_templates(files: tuple[str, ...]) -> None:
    paths = [f if f.startswith("/") else str(WRITTEN / f) for f in files]
    assert summarise(workloads(read_all(paths))) == WRITTEN_EXPECTED[files]


def test_no_workload_kind_is_skipped_as_running_no_pods() -> None:
    """The old gap: every PyTorchJob, RayService, ... was "runs no pods". Now only objects that run none are."""
    results = workloads(read_all([str(PUBLIC), str(WRITTEN)]))
    skipped = {r.kind for r in results if isinstance(r, Skipped)}
    assert skipped == {"ConfigMap", "Secret", "Service", "ClusterTrainingRuntime", "Namespace", "Dashboard", "NIMCache",
                       "ClusterQueue", "ResourceQuota"}


def one(data: dict[str, Any], ctx: Context | None = None) -> list[Workload]:
    found = pod_templates(Document("f.yaml", 0, data), ctx)
    assert isinstance(found, list)
    return found


POD = {"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}


def test_kinds_are_matched_by_api_group_and_kind() -> None:
    volcano = one({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "v"},
                   "spec": {"tasks": [{"replicas": 2, "template": POD}]}})
    batch = one({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "b"},
                 "spec": {"parallelism": 3, "template": POD}})
    assert [(w.role, w.replicas, w.family, w.pod["spec"].get("schedulerName")) for w in volcano] == [
        ("default0", 2, "volcano", "volcano")]  # Volcano names unnamed tasks and sets its scheduler
    assert [(w.role, w.replicas, w.family, w.template_path) for w in batch] == [("", 3, "job", "/spec/template")]
    # The same kind name in an unknown group is not taken for a batch Job: it is walked instead.
    other = one({"apiVersion": "example.com/v1", "kind": "Job", "metadata": {"name": "o"},
                 "spec": {"template": POD}})
    assert [(w.walked, w.role) for w in other] == [(True, "spec.template")]


def test_a_known_kind_without_apiversion_is_still_read_as_that_kind() -> None:
    found = one({"kind": "PyTorchJob", "metadata": {"name": "p"},
                 "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": POD}}}})
    assert [(w.role, w.replicas, w.walked, w.family) for w in found] == [("Worker", 2, False, "training")]


def test_volcano_task_without_replicas_makes_no_pods_and_keeps_its_own_scheduler() -> None:
    [task] = one({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "v"},
                  "spec": {"schedulerName": "kai-scheduler",
                           "tasks": [{"name": "t", "template": {"spec": {**POD["spec"], "schedulerName": "x"}}}]}})
    assert (task.replicas, task.pod["spec"]["schedulerName"]) == (0, "x")


def test_trainjob_numnodes_and_resources_override_the_trainer_container_only() -> None:
    ctx = context(read_all([str(WRITTEN / "trainjob-with-runtime.yaml")]))
    [init, node] = one({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                        "metadata": {"name": "t", "namespace": "ml"},
                        "spec": {"runtimeRef": {"name": "torch-distributed"},
                                 "trainer": {"numNodes": 5, "image": "mine:1", "env": [{"name": "A", "value": "1"}],
                                             "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}}}}, ctx)
    container = node.pod["spec"]["containers"][0]
    assert (node.role, node.replicas, node.family, node.group_size) == ("node", 5, "jobset", 5)
    assert (container["image"], container["resources"], container["env"]) == (
        "mine:1", {"limits": {"nvidia.com/gpu": 4}}, [{"name": "A", "value": "1"}])
    assert container["command"] == ["/bin/bash", "-c", "torchrun train.py"]  # kept from the runtime
    assert init.pod["spec"]["containers"][0]["image"] == "ghcr.io/kubeflow/trainer/model-initializer"
    assert node.pod["metadata"]["namespace"] == "ml"


def test_trainjob_with_a_namespaced_runtime_and_without_any() -> None:
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
               "metadata": {"name": "rt", "namespace": "ml"},
               "spec": {"mlPolicy": {"numNodes": 2},
                        "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {
                            "template": POD}}}]}}}}
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "t",
           "namespace": "ml"}, "spec": {"runtimeRef": {"name": "rt", "kind": "TrainingRuntime"}}}
    ctx = context([Document("r.yaml", 0, runtime)])
    assert [(w.role, w.replicas) for w in one(job, ctx)] == [("node", 2)]
    with pytest.raises(UserError) as err:
        one(job)
    assert str(err.value) == (
        "f.yaml: document 0: field spec.runtimeRef: cannot decide: its pods come from TrainingRuntime rt, "
        "which is not in the input; pass that runtime's manifest too (its pod templates are in "
        "spec.template.spec.replicatedJobs)")


def test_jobset_counts_replicas_times_parallelism_capped_by_completions() -> None:
    [workers, driver] = one({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"},
                             "spec": {"replicatedJobs": [
                                 {"name": "workers", "replicas": 3,
                                  "template": {"spec": {"parallelism": 4, "completions": 2, "template": POD}}},
                                 {"name": "driver", "template": {"spec": {"template": POD}}}]}})
    assert [(workers.role, workers.replicas, workers.group_size), (driver.role, driver.replicas)] == [
        ("workers", 6, 2), ("driver", 1)]


def test_leader_worker_set_with_and_without_a_leader_template() -> None:
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "l"},
           "spec": {"replicas": 3, "leaderWorkerTemplate": {"size": 4, "leaderTemplate": POD, "workerTemplate": POD}}}
    assert [(w.role, w.replicas, w.group_size) for w in one(lws)] == [("leader", 3, 1), ("worker", 9, 3)]
    solo = {**lws, "spec": {"leaderWorkerTemplate": {"workerTemplate": POD}}}  # replicas and size default to 1
    assert [(w.role, w.replicas) for w in one(solo)] == [("leader+workers", 1)]


def test_ray_worker_groups_replicas_min_max_and_autoscaling() -> None:
    group = {"groupName": "g", "replicas": 1, "minReplicas": 2, "maxReplicas": 5, "numOfHosts": 2, "template": POD}
    spec = {"headGroupSpec": {"template": POD}, "workerGroupSpecs": [group]}
    fixed = one({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r"}, "spec": spec})
    assert [(w.role, w.replicas) for w in fixed] == [("head", 1), ("g", 4)]  # replicas raised to minReplicas
    scaled = one({"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "r"},
                  "spec": {"rayClusterConfig": {**spec, "enableInTreeAutoscaling": True}}})
    assert scaled[1].replicas == 4
    assert scaled[1].notes[0] == "autoscaled: decided at minReplicas 2 (up to maxReplicas 5)"


def test_rayjob_on_an_existing_cluster() -> None:
    job = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "j"},
           "spec": {"clusterSelector": {"ray.io/cluster": "shared"}}}
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "shared"},
               "spec": {"headGroupSpec": {"template": POD}}}
    found = pod_templates(Document("f.yaml", 0, job), context([Document("c.yaml", 3, cluster)]))
    assert isinstance(found, Skipped)
    assert found.reason == "runs on RayCluster shared, decided as its own document [c.yaml:3]"
    with pytest.raises(UserError, match="field spec.clusterSelector: cannot decide: runs on an existing RayCluster"):
        one(job)


@pytest.mark.parametrize(
    ("predictor", "containers", "replicas"),
    [
        ({"pytorch": {"storageUri": "s3://m", "resources": {"limits": {"nvidia.com/gpu": 1}}}},
         [{"name": "kserve-container", "image": "<pytorch serving runtime>",
           "resources": {"limits": {"nvidia.com/gpu": 1}}}], 1),
        ({"minReplicas": 0, "model": {"modelFormat": {"name": "sklearn"}, "runtime": "r", "args": ["--x"]},
          "containers": [{"name": "side", "image": "s"}]},
         [{"name": "kserve-container", "image": "<model serving runtime>", "args": ["--x"]},
          {"name": "side", "image": "s"}], 0),
        ({"containers": [{"name": "own", "image": "o"}], "nodeSelector": {"a": "b"}, "maxReplicas": 3},
         [{"name": "own", "image": "o"}], 1),
    ],
)
def test_inference_service_component_forms(predictor: dict[str, Any], containers: list[Any], replicas: int) -> None:
    [found] = one({"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "i"},
                   "spec": {"predictor": predictor}})
    assert (found.role, found.replicas, found.pod["spec"]["containers"]) == ("predictor", replicas, containers)
    assert not {"minReplicas", "maxReplicas", "model", "pytorch"} & set(found.pod["spec"])


def test_inference_service_errors_and_llm_workers() -> None:
    with pytest.raises(UserError, match="field spec.predictor: names 2 frameworks"):
        one({"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "i"},
             "spec": {"predictor": {"onnx": {}, "triton": {}}}})
    llm = one({"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LLMInferenceService", "metadata": {"name": "l"},
               "spec": {"replicas": 2, "parallelism": {"data": 8, "dataLocal": 2},
                        "template": POD["spec"], "worker": POD["spec"],
                        "prefill": {"replicas": 1, "template": POD["spec"]}}})
    assert [(w.role, w.replicas, w.family) for w in llm] == [
        ("workload", 2, "llmisvc"), ("worker", 6, "lws"), ("prefill", 1, "llmisvc")]


def test_argo_workflow_template_ref() -> None:
    workflow = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "w"},
                "spec": {"workflowTemplateRef": {"name": "tpl"}}}
    template = {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate", "metadata": {"name": "tpl"},
                "spec": {"templates": [{"name": "t", "container": POD["spec"]["containers"][0]}]}}
    found = pod_templates(Document("f.yaml", 0, workflow), context([Document("t.yaml", 0, template)]))
    assert isinstance(found, Skipped) and "WorkflowTemplate tpl, decided as its own document [t.yaml:0]" in found.reason
    with pytest.raises(UserError, match="spec.workflowTemplateRef: cannot decide: its pods come from WorkflowTemplate"):
        one(workflow)
    [pod] = one(template)
    assert [c["name"] for c in pod.pod["spec"]["containers"]] == ["wait", "main"]
    assert pod.pod["spec"]["restartPolicy"] == "Never"


def test_template_holders_and_cluster_scoped_objects_run_no_pods() -> None:
    holder = pod_templates(Document("f.yaml", 0, {"apiVersion": "v1", "kind": "PodTemplate",
                                                  "metadata": {"name": "p"}, "template": POD}))
    assert isinstance(holder, Skipped) and holder.reason == "PodTemplate runs no pods: controllers copy from it"
    namespace = pod_templates(Document("f.yaml", 0, {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": "ml", "namespace": "x"}}))
    assert isinstance(namespace, Skipped) and (namespace.cluster_scoped, namespace.namespace) == (True, None)


def test_reading_leniently_keeps_the_documents_around_broken_ones(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("kind: Pod\nmetadata: {name: a}\n---\nkind: [\n---\n- x\n---\nkind: Service\n")
    entries = read_all([str(path), str(tmp_path / "gone.yaml")])
    assert [(type(e).__name__, e.source) for e in entries] == [
        ("Document", f"{path}:0"), ("Problem", f"{path}:1"), ("Problem", f"{path}:2"), ("Document", f"{path}:3"),
        ("Problem", str(tmp_path / "gone.yaml"))]
    assert isinstance(entries[1], Problem) and entries[1].message.startswith("line 5, column 1: invalid YAML")
    with pytest.raises(UserError):  # the strict reader (used for cluster files) still stops at the first
        load_documents([str(path)])


def test_stdin_reads_leniently() -> None:
    entries = read_all(["-"], stdin=io.StringIO("kind: Pod\n---\n[\n"))
    assert [type(e).__name__ for e in entries] == ["Document", "Problem"]


def test_walking_visits_each_object_once_even_when_yaml_aliases_make_it_contain_itself(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("apiVersion: example.com/v1\nkind: Loop\nmetadata: {name: l}\n"
                    "spec: &a\n  self: *a\n  many: [*a, *a, *a, *a, *a, *a, *a, *a]\n"
                    "  pod: &p {template: {spec: {containers: [{name: c, image: i}]}}}\n  again: *p\n")
    [found] = workloads(read_all([str(path)]))
    assert isinstance(found, Workload) and found.role == "spec.pod.template"


def test_component_containers_must_be_a_list() -> None:
    with pytest.raises(UserError, match="field spec.predictor.containers: expected a list, got a mapping"):
        one({"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "i"},
             "spec": {"predictor": {"containers": {"name": "c"}}}})


def test_elastic_pytorchjob_workers_are_decided_at_their_starting_replicas() -> None:
    [worker] = one({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "e"},
                    "spec": {"elasticPolicy": {"minReplicas": 1, "maxReplicas": 8},
                             "pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": POD}}}})
    assert (worker.replicas, worker.notes) == (2, ("elastic (1..8 workers): decided at the replicas it starts with",))


def test_an_inline_pod_spec_needs_images_to_be_taken_for_one() -> None:
    found = pod_templates(Document("f.yaml", 0, {"apiVersion": "x.io/v1", "kind": "Schema", "metadata": {"name": "s"},
                                                 "spec": {"containers": [{"name": "no-image"}]}}))
    assert isinstance(found, Skipped) and found.reason == "Schema runs no pods"
