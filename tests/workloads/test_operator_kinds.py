"""Operators' own kinds decided as the pods their controllers make: NVIDIA NIM's NIMService, vLLM
production-stack's VLLMRuntime, the Spark Operator's SparkApplication and Katib's Experiment (its trial
object, once per trial running at once)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from webhook.cli import main
from webhook.core.podspec.resources import parse_pod
from webhook.errors import UserError
from webhook.manifests import Document, Problem, read_all
from webhook.workloads import Context, Skipped, Workload, context, pod_templates, workloads

FIXTURES = Path(__file__).parent.parent / "fixtures" / "workloads"
PUBLIC, WRITTEN = FIXTURES / "public", FIXTURES / "written"
KATIB_CONFIGMAP = PUBLIC / "katib-manifests-v1beta1-components-controller-trial-templates.yaml"


def one(data: dict[str, Any], ctx: Context | None = None) -> list[Workload]:
    found = pod_templates(Document("f.yaml", 0, data), ctx)
    assert isinstance(found, list)
    return found


def containers(w: Workload) -> list[tuple[str, Any]]:
    return [(c["name"], (c.get("resources") or {}).get("limits")) for c in w.pod["spec"]["containers"]]


NIM = {"apiVersion": "apps.nvidia.com/v1alpha1", "kind": "NIMService", "metadata": {"name": "llm", "namespace": "ml"},
       "spec": {"image": {"repository": "nvcr.io/nim/meta/llama-3.1-8b-instruct", "tag": "1.3.3"},
                "replicas": 3, "resources": {"limits": {"nvidia.com/gpu": 2}},
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "annotations": {"team": "a"}, "sidecarContainers": [
                    {"name": "proxy", "image": {"repository": "envoyproxy/envoy", "tag": "v1.31"}}]}}


def test_nimservice_is_the_deployment_its_operator_renders() -> None:
    [w] = one(NIM)
    assert (w.kind, w.replicas, w.template_path) == ("NIMService", 3, "/spec")
    assert containers(w) == [("llm-ctr", {"nvidia.com/gpu": 2}), ("proxy", None)]
    assert w.pod["spec"]["containers"][0]["image"] == "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3.3"
    assert w.pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert w.pod["metadata"]["annotations"] == {"team": "a"}


def test_nimservice_without_gpus_gets_what_the_operator_assigns_and_autoscaling_counts_min_replicas() -> None:
    spec = {**NIM["spec"], "resources": {"limits": {"cpu": "8"}},
            "scale": {"enabled": True, "hpa": {"minReplicas": 2, "maxReplicas": 6}}}
    [w] = one({**NIM, "spec": spec})
    assert (w.replicas, parse_pod(w.pod).gpus) == (2, 1)
    assert w.notes == ("no nvidia.com/gpu in spec.resources: the operator assigns its NIMCache profile's tensor "
                       "parallelism (1 when none); decided at 1",
                       "autoscaled: decided at scale.hpa.minReplicas 2 (up to maxReplicas 6)")


def test_multi_node_nimservice_is_a_leader_worker_set_of_pipeline_parallel_pods() -> None:
    spec = {**NIM["spec"], "replicas": 2, "resources": {},
            "multiNode": {"parallelism": {"pipeline": 4, "tensor": 8}}}
    leader, worker = one({**NIM, "spec": spec})
    assert [(w.role, w.replicas, w.family, w.group_size, parse_pod(w.pod).gpus) for w in (leader, worker)] == [
        ("leader", 2, "lws", 1, 8), ("worker", 6, "lws", 3, 8)]  # tensor 8 GPUs per pod, 2 groups of 4


def test_nimservice_through_dra_claims_is_not_passed_silently() -> None:
    with pytest.raises(UserError, match="field spec.draResources: cannot decide: the GPUs come through DRA claims"):
        one({**NIM, "spec": {**NIM["spec"], "draResources": [{"resourceClaimTemplateName": "gpu"}]}})


VLLM = {"apiVersion": "production-stack.vllm.ai/v1alpha1", "kind": "VLLMRuntime", "metadata": {"name": "v"},
        "spec": {"model": {"modelURL": "Qwen/Qwen3-8B"}, "vllmConfig": {"tensorParallelSize": 2},
                 "deploymentConfig": {"replicas": 2, "image": {"registry": "docker.io", "name": "vllm/vllm-openai"},
                                      "resources": {"cpu": "4", "gpu": "2", "gpuType": "amd.com/gpu"},
                                      "sidecarConfig": {"enabled": True, "name": "lora",
                                                        "image": {"registry": "r", "name": "s"}}}}}


def test_vllmruntime_gpu_field_becomes_the_vllm_containers_resources_of_its_gpu_type() -> None:
    [w] = one(VLLM)
    assert (w.replicas, w.template_path) == (2, "/spec/deploymentConfig")
    assert containers(w) == [("vllm", {"cpu": "4", "amd.com/gpu": "2"}),
                             ("lora", {"cpu": "0.5", "memory": "128Mi", "nvidia.com/gpu": "0"})]  # as the operator
    assert w.pod["spec"]["runtimeClassName"] == "nvidia"  # the CRD's default runtimeClass


def test_vllmruntime_autoscaled_by_keda_is_kept_within_min_and_max() -> None:
    deploy = {**VLLM["spec"]["deploymentConfig"], "replicas": 1, "resources": {"gpu": "1"}}
    spec = {**VLLM["spec"], "deploymentConfig": deploy, "autoscalingConfig": {"enabled": True, "minReplicas": 3,
                                                                            "maxReplicas": 5}}
    [w] = one({**VLLM, "spec": spec})
    assert (w.replicas, parse_pod(w.pod).gpus) == (3, 1)
    assert w.notes == ("autoscaled by KEDA between minReplicas 3 and maxReplicas 5: decided at 3",)


def test_spark_driver_and_executors_get_their_gpus_as_the_operators_webhook_adds_them() -> None:
    driver, executor, conf_driver, conf_executor = workloads(read_all([str(WRITTEN / "spark-gpu.yaml")]))
    assert isinstance(driver, Workload) and isinstance(executor, Workload)
    assert [(w.role, w.replicas, containers(w)) for w in (driver, executor)] == [
        ("driver", 1, [("spark-kubernetes-driver", {"nvidia.com/gpu": 1})]),
        ("executor", 3, [("spark-kubernetes-executor", {"nvidia.com/gpu": 2})])]
    assert driver.pod["metadata"]["labels"] == {"spark-role": "driver"}
    # sparkConf's spark.executor.resource.gpu.amount with its vendor; dynamic allocation starts at minExecutors
    assert isinstance(conf_executor, Workload) and isinstance(conf_driver, Workload)
    assert (conf_driver.replicas, containers(conf_driver)) == (1, [("spark-kubernetes-driver", None)])
    assert (conf_executor.replicas, containers(conf_executor)) == (2, [("spark-kubernetes-executor",
                                                                         {"nvidia.com/gpu": "1"})])
    assert conf_executor.notes == ("dynamic allocation: decided at its initial executors 2 (up to 8)",)


def test_spark_pod_template_container_and_scheduled_applications() -> None:
    template = {"spec": {"containers": [{"name": "side", "image": "s"},
                                        {"name": "spark-kubernetes-executor", "image": "x", "env": [{"name": "A"}]}]}}
    app = {"image": "spark:3.5", "driver": {}, "executor": {"instances": 4, "template": template,
                                                             "gpu": {"name": "nvidia.com/gpu", "quantity": 1}}}
    _, executor = one({"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "ScheduledSparkApplication",
                       "metadata": {"name": "nightly"}, "spec": {"schedule": "@daily", "template": app}})
    assert (executor.replicas, executor.template_path) == (4, "/spec/template/executor")
    assert containers(executor) == [("side", None), ("spark-kubernetes-executor", {"nvidia.com/gpu": 1})]
    assert executor.pod["spec"]["containers"][1]["env"] == [{"name": "A"}]  # the template's container, kept


def test_spark_gpu_amount_without_vendor_is_an_input_error() -> None:
    with pytest.raises(UserError, match="field spec.sparkConf: spark.executor.resource.gpu.amount without spark"):
        one({"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication", "metadata": {"name": "s"},
             "spec": {"sparkConf": {"spark.executor.resource.gpu.amount": "1"}, "driver": {}, "executor": {}}})


EXPERIMENT = {"apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment", "metadata": {"name": "hp", "namespace": "ml"},
              "spec": {"maxTrialCount": 12, "trialTemplate": {"primaryContainerName": "train", "trialSpec": {
                  "apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": {"containers": [
                      {"name": "train", "image": "t", "args": ["--lr=${trialParameters.lr}"],
                       "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}}}}}}


def test_katib_experiment_runs_parallel_trial_count_trials_at_once_each_its_own_job() -> None:
    found = one(EXPERIMENT)  # parallelTrialCount defaults to 3 (Katib's DefaultTrialParallelCount)
    assert [(w.role, w.replicas, w.controller, w.family, parse_pod(w.pod).gpus) for w in found] == [
        (f"trial {n + 1}/3: Job", 1, ("Job", f"hp-trial-{n}"), "job", 2) for n in range(3)]
    assert found[0].template_path == "/spec/trialTemplate/trialSpec/spec/template"
    assert found[0].notes[-1] == "parallelTrialCount: 3 trials run at once, each its own Job; quota must hold them all"
    capped = one({**EXPERIMENT, "spec": {**EXPERIMENT["spec"], "parallelTrialCount": 5, "maxTrialCount": 2}})
    assert len(capped) == 2  # never more at once than maxTrialCount


def test_katib_trial_template_from_a_configmap_in_the_input() -> None:
    paths = [str(PUBLIC / "katib-examples-trial-template-trial-configmap-source.yaml"), str(KATIB_CONFIGMAP)]
    results = workloads(read_all(paths))
    rows = [(r.role, r.replicas) if isinstance(r, Workload) else type(r).__name__ for r in results]
    assert rows == [("trial 1/2: Job", 1), ("trial 2/2: Job", 1), "Skipped"]
    alone = workloads(read_all(paths[:1]))
    assert isinstance(alone[0], Problem) and alone[0].message.startswith(
        "cannot decide: the trial template is in ConfigMap trial-templates, which is not in the input")
    ctx = context(read_all([str(KATIB_CONFIGMAP)]))
    missing = {**EXPERIMENT, "spec": {"trialTemplate": {"configMap": {
        "configMapName": "trial-templates", "configMapNamespace": "kubeflow", "templatePath": "nope"}}}}
    with pytest.raises(UserError, match="ConfigMap trial-templates .* has no data key nope"):
        one(missing, ctx)


def test_katib_trial_that_runs_no_pods_and_a_broken_trial_name_its_own_field() -> None:
    service = {**EXPERIMENT, "spec": {"trialTemplate": {"trialSpec": {"apiVersion": "v1", "kind": "Service"}}}}
    with pytest.raises(UserError, match="field spec.trialTemplate.trialSpec: the trial's Service runs no pods"):
        one(service)
    broken = {**EXPERIMENT, "spec": {"trialTemplate": {"trialSpec": {"apiVersion": "batch/v1", "kind": "Job",
                                                                      "spec": {"parallelism": -1, "template": {}}}}}}
    with pytest.raises(UserError, match="field spec.trialTemplate.trialSpec.spec.parallelism: expected a whole"):
        one(broken)


def cluster(tmp_path: Path, quota: int) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"""apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: h100-0
    labels: {{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, nvidia.com/gpu.memory: "81559", nvidia.com/gpu.count: "8"}}
  status: {{allocatable: {{cpu: "200", memory: 2000Gi, nvidia.com/gpu: "8"}}}}
- apiVersion: v1
  kind: Namespace
  metadata: {{name: ml, labels: {{gpu-admission.io/enabled: "true"}}}}
- apiVersion: v1
  kind: ResourceQuota
  metadata: {{name: gpus, namespace: ml}}
  spec: {{hard: {{requests.nvidia.com/gpu: "{quota}"}}}}
""")
    return str(path)


@pytest.mark.parametrize(("quota", "code"), [(6, 0), (5, 1)])
def test_check_holds_every_parallel_trial_against_the_quota(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            quota: int, code: int) -> None:
    manifest = tmp_path / "experiment.yaml"
    manifest.write_text(str(EXPERIMENT).replace("'", '"'))  # JSON is YAML
    assert main(["check", "--cluster", cluster(tmp_path, quota), str(manifest)]) == code
    out = capsys.readouterr().out
    lines = [line.split("  [")[0] for line in out.splitlines() if line[:5] in ("ALLOW", "DENY ")]
    assert lines[0].startswith("ALLOW  Experiment ml/hp: trial 1/3: Job: node h100-0")
    assert lines[2].startswith("ALLOW  Experiment ml/hp: trial 3/3: Job" if code == 0 else
                               "DENY   Experiment ml/hp: trial 3/3: Job: 403 quota-exceeded")


@pytest.mark.parametrize("name", ["spark-gpu.yaml"])
def test_skips_and_kinds_of_the_written_operator_fixtures(name: str) -> None:
    results = workloads(read_all([str(WRITTEN / name)]))
    assert not [r for r in results if isinstance(r, (Skipped, Problem))]
