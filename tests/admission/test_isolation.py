"""Routes to a GPU outside the resource request: limit-layer switches, envFrom, ephemeral containers,
GPU-reachable pods that ask for none, and hostPaths compared after normalising."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from builders import H100, node, pod, snapshot
from flask.testing import FlaskClient
from isolation_support import CONFIG_MAPS, SNAP, VOID, chain, cpu_pod

from webhook.core.admission import admit
from webhook.core.admission.envfrom import env_from_keys
from webhook.core.domain.model import Snapshot
from webhook.core.podspec.fastpath import is_gpu_pod, needs_decision
from webhook.core.podspec.hostpaths import is_device_hostpath
from webhook.core.podspec.limits import ISOLATION_ENV, is_isolation_env
from webhook.core.podspec.resources import parse_pod
from webhook.core.policy.model import Policy, parse_policy
from webhook.policyfile.holder import PolicyHolder
from webhook.server.admission import real_core
from webhook.server.app import ServerConfig, create_app
from webhook.server.source import StaticSource

CLAIMS = Path(__file__).parent.parent / "fixtures" / "dra" / "claims.yaml"

def gpu_pod(**container: Any) -> dict[str, Any]:
    p = pod({"nvidia.com/gpu": 1})
    p["spec"]["containers"][0].update(container)
    return p


def env_from(*sources: dict[str, Any]) -> dict[str, Any]:
    return {"name": "app", "image": "img", "envFrom": list(sources)}


# --------------------------------------------------------------------------- the limit layer's switches

SWITCHES = [
    "GPU_CORE_UTILIZATION_POLICY", "ACTIVE_OOM_KILLER", "CUDA_DISABLE_CONTROL", "CUDA_OVERSUBSCRIBE",
    "CUDA_TASK_PRIORITY", "CUDA_REDIRECT", "CUDA_DEVICE_MEMORY_SHARED_CACHE", "CUDA_DEVICE_SM_LIMIT_0",
    "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_MPS_CLIENT_PRIORITY",
    "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING", "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_IMEX_CHANNELS", "NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH",
    "NVIDIA_VISIBLE_DEVICES",
]


@pytest.mark.parametrize("name", SWITCHES)
def test_every_switch_of_the_limit_layer_is_refused_in_any_pod(name: str) -> None:
    value = "0" if name == "CUDA_TASK_PRIORITY" else "1"  # 1 is HAMi-core's default priority: a pin's value
    container = {"name": "app", "image": "img", "env": [{"name": name, "value": value}]}
    assert is_gpu_pod(cpu_pod(container))
    for p in (cpu_pod(container), gpu_pod(env=[{"name": name, "value": value}])):
        decision = admit.mutate(p, SNAP, Policy())
        assert (decision.allowed, decision.reason) == (False, "isolation-env")
        assert name in decision.message


@pytest.mark.parametrize("name", ["LIBCUDA_LOG_LEVEL", "RECORD_KERNEL_INTERVAL", "CUDA_VISIBLE_DEVICES",
                                  "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA", "CUDA_DEVICE_ORDER"])
def test_harmless_variables_of_those_layers_pass(name: str) -> None:
    assert not is_isolation_env(name)
    decision, _, validated = chain(gpu_pod(env=[{"name": name, "value": "1"}]))
    assert decision.allowed and validated.allowed


def test_the_table_names_the_layer_of_every_exact_variable() -> None:
    assert all(":" in why and why.split(":")[0] for why in ISOLATION_ENV.values())
    assert {"NVIDIA_VISIBLE_DEVICES", "LD_PRELOAD", "CUDA_DISABLE_CONTROL", "ACTIVE_OOM_KILLER"} <= ISOLATION_ENV.keys()


def test_void_grants_nothing_and_is_not_a_bypass() -> None:
    container = {"name": "app", "image": "img", "env": [VOID]}
    assert not is_gpu_pod(cpu_pod(container))
    assert parse_pod(cpu_pod(container)).violations == ()


# --------------------------------------------------------------------------- hostPath


@pytest.mark.parametrize("path", ["//dev/nvidia0", "/dev/../dev/nvidia0", "/dev/./nvidiactl", "/dev/char", "/dev",
                                  "/", "//", "/dev/nvidia-caps", "/dev/nvidia-uvm", "/run/nvidia", "/run/nvidia/driver",
                                  "/var/run/nvidia-persistenced", "/usr/local/vgpu", "/dev/dri", "/run", "/dev/kfd"])
def test_host_paths_that_reach_gpu_devices_or_the_driver_are_refused(path: str) -> None:
    p = cpu_pod(volumes=[{"name": "h", "hostPath": {"path": path}}])
    assert is_device_hostpath(path)
    decision = admit.mutate(p, SNAP, Policy())
    assert (decision.allowed, decision.reason) == (False, "isolation-hostpath")


@pytest.mark.parametrize("path", ["/data", "/mnt/datasets", "/var/log", "/dev/shm", "/var/lib/kubelet/device-plugins",
                                  "/dev/infiniband", "/runx", "/usr/share/models"])
def test_ordinary_host_directories_stay_allowed_in_gpu_pods(path: str) -> None:
    p = gpu_pod(volumeMounts=[{"name": "h", "mountPath": "/in"}])
    p["spec"]["volumes"] = [{"name": "h", "hostPath": {"path": path}}]
    decision, _, validated = chain(p)
    assert decision.allowed and validated.allowed, decision.message


# --------------------------------------------------------------------------- envFrom


def test_config_maps_are_reduced_to_the_keys_that_can_name_isolation_variables() -> None:
    assert env_from_keys({"LOG_LEVEL": "info", "config.yaml": "..."}) == frozenset()
    assert env_from_keys({"NVIDIA_VISIBLE_DEVICES": "all", "A": "1"}) == {"NVIDIA_VISIBLE_DEVICES"}
    # With prefix CUDA_ a key MPS_X is CUDA_MPS_X; with prefix NVIDIA_VISIBLE_ a key DEVICES is the device list.
    assert env_from_keys({"MPS_X": "1", "DEVICES": "all", "_PRELOAD": "x"}) == {"MPS_X", "DEVICES", "_PRELOAD"}
    assert env_from_keys(None) == frozenset()


@pytest.mark.parametrize(
    ("source", "variable"),
    [
        ({"configMapRef": {"name": "escape"}}, "NVIDIA_VISIBLE_DEVICES"),
        ({"configMapRef": {"name": "tails"}, "prefix": "NVIDIA_VISIBLE_"}, "NVIDIA_VISIBLE_DEVICES"),
        ({"configMapRef": {"name": "tails"}, "prefix": "CUDA_MPS_"}, "CUDA_MPS_"),
        ({"configMapRef": {"name": "switch"}}, "GPU_CORE_UTILIZATION_POLICY"),
        ({"secretRef": {"name": "anything"}, "prefix": "CUDA_DEVICE_"}, "CUDA_DEVICE_"),
    ],
)
def test_env_from_setting_isolation_variables_is_refused_in_any_pod(source: dict[str, Any], variable: str) -> None:
    for p in (cpu_pod(env_from(source)), gpu_pod(envFrom=[source])):
        decision = admit.mutate(p, SNAP, Policy())
        assert (decision.allowed, decision.reason) == (False, "isolation-env"), decision.message
        assert variable in decision.message


def test_prefix_that_makes_no_isolation_name_passes() -> None:
    decision, _, validated = chain(gpu_pod(envFrom=[{"configMapRef": {"name": "tails"}, "prefix": "APP_"}]))
    assert decision.allowed and validated.allowed


def test_ld_preload_from_a_config_map_only_matters_in_a_gpu_pod() -> None:
    source = {"configMapRef": {"name": "preload"}}
    assert admit.mutate(cpu_pod(env_from(source)), SNAP, Policy()).allowed
    decision = admit.mutate(gpu_pod(envFrom=[source]), SNAP, Policy())
    assert (decision.allowed, decision.reason) == (False, "isolation-env") and "LD_PRELOAD" in decision.message


def test_gpu_pod_with_ordinary_settings_in_env_from_is_admitted_unchanged_but_for_its_limits() -> None:
    decision, final, validated = chain(gpu_pod(envFrom=[{"configMapRef": {"name": "settings"}}]))
    assert decision.allowed and validated.allowed and decision.warnings == ()
    assert final["spec"]["containers"][0]["envFrom"] == [{"configMapRef": {"name": "settings"}}]


def test_unread_secret_is_neutralised_by_default_and_refused_when_the_policy_says_so() -> None:
    p = gpu_pod(envFrom=[{"secretRef": {"name": "hf-token"}}])
    p["spec"]["containers"].append({"name": "proxy", "image": "envoy", "envFrom": [{"secretRef": {"name": "t"}}]})
    # Nodes whose toolkit honours the variable: the Secret could replace the GPU container's device list.
    refused = admit.mutate(p, SNAP, Policy())
    assert (refused.allowed, refused.reason) == (False, "isolation-env-from") and "Secret 'hf-token'" in refused.message
    closed = dataclasses.replace(SNAP, nodes={"h1": dataclasses.replace(SNAP.nodes["h1"], toolkit_envvar=False),
                                              "cpu-1": SNAP.nodes["cpu-1"]})
    decision, final, validated = chain(p, closed)
    assert decision.allowed and validated.allowed
    assert any("Secret 'hf-token'" in w for w in decision.warnings)
    # The GPU container's own limits are explicit env entries (they win over envFrom), and so are the pins
    # of the limit layer's switches; the container without a GPU gets NVIDIA_VISIBLE_DEVICES=void.
    assert {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "81559m"} in final["spec"]["containers"][0]["env"]
    assert {"name": "ACTIVE_OOM_KILLER", "value": "true"} in final["spec"]["containers"][0]["env"]
    assert final["spec"]["containers"][1]["env"] == [VOID]
    strict = parse_policy({"isolation": {"unresolvedEnvFrom": "deny"}})
    refused = admit.mutate(p, closed, strict)
    assert (refused.allowed, refused.reason) == (False, "isolation-env-from")
    assert "Secret 'hf-token'" in refused.message
    missing = admit.mutate(gpu_pod(envFrom=[{"configMapRef": {"name": "not-seen"}}]), SNAP, strict)
    assert (missing.allowed, "ConfigMap 'not-seen'" in missing.message) == (False, True)


def test_cpu_pod_with_env_from_that_cannot_reach_a_gpu_is_unchanged() -> None:
    p = cpu_pod(env_from({"configMapRef": {"name": "settings"}}, {"secretRef": {"name": "db"}}))
    assert needs_decision(p)  # envFrom sends it to the core ...
    decision, _, validated = chain(p)
    assert (decision.allowed, decision.patch, validated.allowed) == (True, (), True)  # ... which allows it as is


# --------------------------------------------------------------------------- pods that ask for no GPU


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ({"runtimeClassName": "nvidia"}, "runtimeClassName nvidia"),
        ({"runtimeClassName": "nvidia-cdi"}, "runtimeClassName nvidia-cdi"),
        ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}, "nvidia.com/gpu"),
        ({"tolerations": [{"operator": "Exists"}]}, "every taint"),
        ({"nodeName": "h1"}, "a GPU node"),
        ({"nodeName": "somewhere"}, "does not know"),
    ],
)
def test_a_pod_that_asks_for_no_gpu_but_can_reach_one_is_neutralised(spec: dict[str, Any], why: str) -> None:
    p = cpu_pod(initContainers=[{"name": "init", "image": "cuda", "env": [{"name": "A", "value": "1"}]}], **spec)
    assert needs_decision(p)
    decision, final, validated = chain(p)
    assert (decision.allowed, decision.reason, validated.allowed) == (True, "neutralised", True)
    assert why in decision.warnings[0]
    assert final["spec"]["containers"][0]["env"] == [VOID]
    assert final["spec"]["initContainers"][0]["env"] == [{"name": "A", "value": "1"}, VOID]
    # Idempotent: a second pass writes nothing.
    assert admit.mutate(final, SNAP, Policy()).patch == ()
    # The validating webhook refuses it when the mutation did not happen.
    unmutated = admit.validate(p, SNAP, Policy())
    assert (unmutated.allowed, unmutated.reason) == (False, "gpu-reachable")
    # Or when the policy says deny.
    denied = admit.mutate(p, SNAP, parse_policy({"isolation": {"nonGpuAccess": "deny"}}))
    assert (denied.allowed, denied.reason) == (False, "gpu-reachable") and why in denied.message


def test_privileged_container_that_can_reach_a_gpu_node_is_refused() -> None:
    privileged = {"name": "agent", "image": "x", "securityContext": {"privileged": True}}
    decision = admit.mutate(cpu_pod(privileged, tolerations=[{"operator": "Exists"}]), SNAP, Policy())
    assert (decision.allowed, decision.reason) == (False, "isolation-privileged")
    # Without a way onto a GPU node, a privileged pod is left to Pod Security Admission.
    assert admit.mutate(cpu_pod(privileged), SNAP, Policy()).allowed


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"runtimeClassName": "gvisor"},
        {"nodeName": "cpu-1"},
        {"tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                          "tolerationSeconds": 300}]},
        {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra"}]},
    ],
)
def test_plain_cpu_pods_pass_unchanged(spec: dict[str, Any]) -> None:
    decision, _, validated = chain(cpu_pod(**spec))
    assert (decision.allowed, decision.patch, decision.reason, validated.allowed) == (True, (), "not-gpu-pod", True)


def test_plain_cpu_pod_takes_the_fast_path() -> None:
    tolerations = [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}]
    assert not needs_decision(cpu_pod(tolerations=tolerations))


def test_policy_names_the_gpu_runtime_classes() -> None:
    policy = parse_policy({"isolation": {"gpuRuntimeClasses": ["gpu-runtime"]}})
    assert admit.mutate(cpu_pod(runtimeClassName="gpu-runtime"), SNAP, policy).reason == "neutralised"
    assert admit.mutate(cpu_pod(runtimeClassName="nvidia"), SNAP, policy).reason == "not-gpu-pod"


def test_containers_of_a_gpu_pod_that_get_no_gpu_see_none() -> None:
    p = gpu_pod()
    p["spec"]["containers"].append({"name": "sidecar", "image": "nvcr.io/nvidia/cuda:12.4.1-base"})
    p["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    decision, final, validated = chain(p)
    assert decision.allowed and validated.allowed
    assert final["spec"]["containers"][1]["env"] == [VOID]
    assert final["spec"]["initContainers"][0]["env"] == [VOID]
    assert all(e != VOID for e in final["spec"]["containers"][0]["env"])  # the GPU container keeps its own list
    removed = copy.deepcopy(final)
    del removed["spec"]["containers"][1]["env"]
    refused = admit.validate(removed, SNAP, Policy())
    assert (refused.allowed, refused.reason) == (False, "limits-missing") and "sidecar" in refused.message


# --------------------------------------------------------------------------- ephemeral containers


def client(snap: Snapshot = SNAP, policy: Policy | None = None) -> FlaskClient:
    config = ServerConfig(source=StaticSource(snap), namespace="gpu-admission", core=real_core(),
                          policy=PolicyHolder(None, loader=lambda _path: policy or Policy()))
    return create_app(config).test_client()


def debug_review(target: dict[str, Any], debug: dict[str, Any], node_name: str = "h1") -> dict[str, Any]:
    old = copy.deepcopy(target)
    old["metadata"]["uid"] = "pod-uid"
    old["spec"]["nodeName"] = node_name
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [{"targetContainerName": "main", "stdin": True, "tty": True, **debug}]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-debug",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "ephemeralcontainers",
            "name": old["metadata"]["name"],
            "namespace": "team-a",
            "operation": "UPDATE",
            "object": new,
            "oldObject": old,
        },
    }


def answer(c: FlaskClient, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    response = c.post(endpoint, data=json.dumps(body), content_type="application/json")
    assert response.status_code == 200
    result: dict[str, Any] = response.get_json()["response"]
    return result


def mutated_gpu_pod() -> dict[str, Any]:
    _, final, _ = chain(pod({"nvidia.com/gpu": 1}, name="trainer"))
    return dict(final)


def test_ordinary_kubectl_debug_passes_with_no_gpu_of_its_own() -> None:
    c = client()
    review = debug_review(mutated_gpu_pod(), {"name": "debugger-x7k2p", "image": "busybox"})
    mutated = answer(c, "/mutate", review)
    assert mutated["allowed"] is True
    import base64
    ops = json.loads(base64.b64decode(mutated["patch"]))
    assert ops == [{"op": "add", "path": "/spec/ephemeralContainers/0/env", "value": [VOID]}]
    review["request"]["object"] = jsonpatch.apply_patch(review["request"]["object"], ops)
    assert answer(c, "/validate", review)["allowed"] is True


@pytest.mark.parametrize(
    ("debug", "reason"),
    [
        ({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}, "isolation-env"),
        ({"env": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]}, "isolation-env"),
        ({"env": [{"name": "LD_PRELOAD", "value": "/x.so"}]}, "isolation-env"),
        ({"envFrom": [{"configMapRef": {"name": "escape"}}]}, "isolation-env"),
        ({"securityContext": {"privileged": True}}, "isolation-privileged"),
        ({"resources": {"limits": {"nvidia.com/gpu": "1"}}}, "ephemeral-resources"),
    ],
)
def test_ephemeral_containers_are_held_to_the_isolation_rules(debug: dict[str, Any], reason: str) -> None:
    c = client()
    review = debug_review(mutated_gpu_pod(), {"name": "dbg", "image": "cuda", **debug})
    for endpoint in ("/mutate", "/validate"):
        result = answer(c, endpoint, review)
        assert result["allowed"] is False and result["status"]["reason"] == reason, endpoint


def test_validating_webhook_refuses_an_ephemeral_container_on_a_gpu_node_that_was_not_mutated() -> None:
    c = client()
    review = debug_review(mutated_gpu_pod(), {"name": "dbg", "image": "nvcr.io/nvidia/cuda:12.4.1-base"})
    result = answer(c, "/validate", review)
    assert (result["allowed"], result["status"]["reason"]) == (False, "gpu-reachable")
    # On a CPU node of a pod without GPUs, nothing to reach: allowed as it is.
    plain = debug_review(cpu_pod(), {"name": "dbg", "image": "busybox"}, node_name="cpu-1")
    assert answer(c, "/validate", plain)["allowed"] is True


def test_the_core_reads_ephemeral_containers() -> None:
    p = cpu_pod(ephemeralContainers=[{"name": "dbg", "image": "x", "env": [{"name": "NVIDIA_VISIBLE_DEVICES",
                                                                            "value": "all"}]}])
    request = parse_pod(p)
    assert request.is_gpu_pod and [v.rule for v in request.violations] == ["isolation-env"]
    assert "ephemeral container 'dbg'" in request.violations[0].message


# --------------------------------------------------------------------------- `check --cluster` reads ConfigMaps


def test_check_reads_config_maps_from_cluster_files(tmp_path: Any) -> None:
    from webhook.cluster.files import load_cluster
    from webhook.cluster.translate import build_snapshot
    from webhook.errors import UserError

    (tmp_path / "cluster.yaml").write_text(
        "kind: ConfigMap\nmetadata: {name: escape, namespace: team-a}\ndata: {NVIDIA_VISIBLE_DEVICES: all, A: b}\n"
        "---\nkind: ConfigMap\nmetadata: {name: settings, namespace: team-a}\ndata: {LOG_LEVEL: info}\n"
    )
    snap = build_snapshot(load_cluster([str(tmp_path / "cluster.yaml")]))
    assert snap.config_maps == {"team-a": {"escape": frozenset({"NVIDIA_VISIBLE_DEVICES"}), "settings": frozenset()}}
    (tmp_path / "bad.yaml").write_text("kind: ConfigMap\nmetadata: {name: x}\ndata: [1, 2]\n")
    with pytest.raises(UserError, match=r"bad\.yaml: document 0: field data: expected a mapping"):
        load_cluster([str(tmp_path / "bad.yaml")])


# --------------------------------------------------------------------------- real manifests

NEW_RULES = {"isolation-env", "isolation-env-from", "isolation-hostpath", "gpu-reachable", "ephemeral-resources"}


def test_real_manifests_are_not_refused_by_the_isolation_rules() -> None:
    from webhook.manifests import load_documents
    from webhook.workloads import Workload, workloads

    snap = snapshot(*(node(f"h{i}", H100, 8) for i in range(4)))
    reasons: dict[str, str] = {}
    for path in sorted((Path(__file__).parent.parent / "fixtures" / "manifests").glob("*.y*ml")):
        for w in workloads(load_documents([str(path)])):
            if not isinstance(w, Workload):
                continue
            p = copy.deepcopy(dict(w.pod))
            p.setdefault("metadata", {})["namespace"] = "team-a"  # as if every one ran in a managed namespace
            mutated, final, validated = chain(p, snap)
            reasons[path.name] = mutated.reason
            assert mutated.reason not in NEW_RULES, (path.name, mutated.message)
            if mutated.allowed:
                assert validated.allowed, (path.name, validated.message)
    # The one privileged GPU container was refused before these rules too; the device plugin DaemonSet,
    # which tolerates the GPU taint and asks for no GPU, would see none if it ran in a managed namespace.
    assert reasons["gke-samples-demos-vit-training-example-spec-gcs.yaml"] == "isolation-privileged"
    assert reasons["nvidia-k8s-device-plugin-deployments-static-nvidia-device-plugin.yml"] == "neutralised"
    assert sum(r == "admitted" for r in reasons.values()) >= 18


def test_a_node_whose_toolkit_ignores_the_variable_needs_no_void_but_still_refuses_privileged() -> None:
    closed = dataclasses.replace(node("h2", H100, 8), toolkit_envvar=False)
    snap = dataclasses.replace(snapshot(closed), config_maps=CONFIG_MAPS)
    decision, _, validated = chain(cpu_pod(nodeName="h2"), snap)
    assert (decision.allowed, decision.patch, validated.allowed) == (True, (), True)
    privileged = {"name": "agent", "image": "x", "securityContext": {"privileged": True}}
    refused = admit.mutate(cpu_pod(privileged, nodeName="h2"), snap, Policy())
    assert (refused.allowed, refused.reason) == (False, "isolation-privileged")


def test_a_container_using_a_dra_claim_is_not_neutralised_but_its_sidecar_is() -> None:

    import yaml

    from webhook.core.admission import dra

    claims = [d for d in yaml.safe_load_all(CLAIMS.read_text())
              if d]
    templates = {f"team-a/{d['metadata']['name']}": dra.read_claim(d) for d in claims
                 if d["kind"] == "ResourceClaimTemplate"}
    snap = dataclasses.replace(snapshot(node("h1", H100, 8)), claim_templates=templates)
    p = pod(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "gpu-claim-template"}])
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    p["spec"]["containers"].append({"name": "sidecar", "image": "nvcr.io/nvidia/cuda:12.4.1-base"})
    decision, final, validated = chain(p, snap)
    assert decision.allowed and validated.allowed, decision.message
    assert VOID not in final["spec"]["containers"][0].get("env", [])  # its GPUs come through CDI
    assert final["spec"]["containers"][1]["env"] == [VOID]


def test_the_kubectl_debug_review_fixture_is_neutralised_and_then_admitted(live_snapshot: Snapshot) -> None:
    from server_support import fixture_review, with_gpu

    c = client(live_snapshot)
    for review in (fixture_review("pod-update-ephemeralcontainers-kubectl-debug.json"),
                   with_gpu(fixture_review("pod-update-ephemeralcontainers-kubectl-debug.json"), 64)):
        import base64
        mutated = answer(c, "/mutate", review)
        ops = json.loads(base64.b64decode(mutated["patch"]))
        assert ops == [{"op": "add", "path": "/spec/ephemeralContainers/0/env", "value": [VOID]}]
        review["request"]["object"] = jsonpatch.apply_patch(review["request"]["object"], ops)
        # The pod's own request (even one no node could hold) is not judged again: only the added container.
        assert answer(c, "/validate", review) == {"uid": review["request"]["uid"], "allowed": True}


CHECK_CLUSTER = """\
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
"""
DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: infer}
spec:
  selector: {matchLabels: {app: infer}}
  template:
    metadata: {labels: {app: infer}}
    spec:
      containers:
      - name: server
        image: vllm/vllm-openai
        envFrom: [{configMapRef: {name: infer-config}}]
        resources: {limits: {nvidia.com/gpu: 1}}
"""


@pytest.mark.parametrize(("data", "allowed"), [("{MODEL: llama, LOG_LEVEL: info}", True),
                                               ("{MODEL: llama, NVIDIA_VISIBLE_DEVICES: all}", False)])
def test_check_reads_config_maps_written_next_to_the_workload(tmp_path: Any, capsys: pytest.CaptureFixture[str],
                                                             data: str, allowed: bool) -> None:
    from webhook.cli import main

    (tmp_path / "cluster.yaml").write_text(CHECK_CLUSTER)
    config = f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: infer-config}}\ndata: {data}\n---\n"
    (tmp_path / "app.yaml").write_text(config + DEPLOYMENT)
    main(["check", "--cluster", str(tmp_path / "cluster.yaml"), "--namespace", "team-a", "-o", "json",
          str(tmp_path / "app.yaml")])
    (result,) = [r for r in json.loads(capsys.readouterr().out)["results"] if not r.get("skipped")]
    assert result["allowed"] is allowed, result
    if allowed:  # read, so no warning about an unread source
        assert not any("envFrom" in w for w in result.get("warnings", []))
    else:
        assert "NVIDIA_VISIBLE_DEVICES from ConfigMap 'infer-config'" in result["message"]


def test_a_malformed_host_path_is_refused_naming_the_field() -> None:
    p = cpu_pod(volumes=[{"name": "h", "hostPath": {"path": ["/dev"]}}, {"name": "i", "hostPath": {"path": {}}}])
    assert not is_device_hostpath(["/dev"]) and not is_gpu_pod(p)
    d = admit.mutate(p, SNAP, Policy())
    assert (d.allowed, d.code, d.reason) == (False, 422, "invalid-pod")
    assert d.message == "spec.volumes[0].hostPath.path: expected a string, got a list"


def test_malformed_tolerations_and_ephemeral_names_are_refused_not_errors() -> None:
    p = cpu_pod(tolerations=[{"key": ["nvidia.com/gpu"], "operator": "Exists"}])
    d = admit.mutate(p, SNAP, Policy())
    assert (d.allowed, d.code, d.message) == (False, 422, "spec.tolerations[0].key: expected a string, got a list")
    c = client()
    review = debug_review(mutated_gpu_pod(), {"name": ["dbg"], "image": "busybox"})
    got = answer(c, "/mutate", review)
    assert got["allowed"] is False and got["status"]["code"] == 422
    assert "ephemeralContainers[0].name: expected a string" in got["status"]["message"]
