"""A ConfigMap edited after a GPU pod that reads it through envFrom was admitted.

The kubelet builds a container's environment, envFrom included, each time it starts the container, so
an edit (or a ConfigMap deleted and created anew) reaches the pod at its next restart. A ConfigMap write
that would give a live GPU pod a variable its admission refuses is refused, by the same rule
(`envfrom.refused_keys`); the watch cache keeps who reads what (`Snapshot.env_readers`).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import celpy
import helm_tool
import pytest
from server_support import cluster_objects

from webhook.cluster.cache import ClusterCache
from webhook.cluster.translate import build_snapshot
from webhook.core.admission import configmap_writes, envfrom
from webhook.core.domain.model import EnvReader, Snapshot
from webhook.core.policy.model import Policy
from webhook.policyfile.holder import PolicyHolder
from webhook.server.admission import real_core
from webhook.server.app import ServerConfig, create_app
from webhook.server.source import StaticSource

HOOK = "validate-configmaps.gpu-admission.io"
NS = "team-a"


def pod(name: str, config_map: str = "settings", prefix: str | None = None, *, gpus: int | None = 1,
        phase: str = "Running", namespace: str = NS, container: str = "main") -> dict[str, Any]:
    source: dict[str, Any] = {"configMapRef": {"name": config_map}}
    if prefix is not None:
        source["prefix"] = prefix
    main: dict[str, Any] = {"name": container, "image": "cuda", "envFrom": [source]}
    if gpus is not None:
        main["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
            "spec": {"nodeName": "gpu-a", "containers": [main]}, "status": {"phase": phase}}


def config_map(name: str = "settings", data: dict[str, str] | None = None, namespace: str = NS) -> dict[str, Any]:
    found: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": name, "namespace": namespace}}
    if data is not None:
        found["data"] = data
    return found


def write(new: dict[str, Any], old: dict[str, Any] | None = None, *, dry_run: bool = False) -> dict[str, Any]:
    """The AdmissionRequest of a ConfigMap CREATE (no `old`) or UPDATE."""
    request: dict[str, Any] = {
        "uid": "u-cm", "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
        "resource": {"group": "", "version": "v1", "resource": "configmaps"},
        "namespace": new["metadata"]["namespace"], "name": new["metadata"]["name"],
        "operation": "CREATE" if old is None else "UPDATE", "userInfo": {"username": "alice"},
        "object": new, "oldObject": old, "dryRun": dry_run}
    return request


def snapshot_of(*objects: dict[str, Any]) -> Snapshot:
    return build_snapshot([*cluster_objects(), *objects])


def decide(request: dict[str, Any], snapshot: Snapshot) -> Any:
    return configmap_writes.config_map_write(request, snapshot, Policy())


# --------------------------------------------------------------------------- the rule


def readers(prefix: str = "", where: str = "container 'main'", name: str = "train-0", pods: int = 1
            ) -> list[EnvReader]:
    return [EnvReader(prefix, where, name, pods)]


def test_a_device_variable_without_prefix_is_refused_with_a_message_to_act_on() -> None:
    (refusal,) = configmap_writes.config_map_refusals(NS, "settings", ["LOG_LEVEL", "NVIDIA_VISIBLE_DEVICES"],
                                               readers(pods=3))
    assert (refusal.rule, refusal.code) == ("isolation-env-configmap", 403)
    message = refusal.message
    for part in ("ConfigMap 'settings'", "key NVIDIA_VISIBLE_DEVICES", "container toolkit", "container 'main'",
                 f"{NS}/train-0", "and 2 more pods", "remove that key", "delete those pods first"):
        assert part in message, part


def test_a_prefix_forms_the_variable_from_a_short_key() -> None:
    (refusal,) = configmap_writes.config_map_refusals(NS, "settings", ["VISIBLE_DEVICES", "HOST"], readers("NVIDIA_"))
    assert "key VISIBLE_DEVICES would set NVIDIA_VISIBLE_DEVICES" in refusal.message
    assert "prefix NVIDIA_" in refusal.message
    # The same key without that prefix is an ordinary variable.
    assert configmap_writes.config_map_refusals(NS, "settings", ["VISIBLE_DEVICES"], readers()) == []


@pytest.mark.parametrize("key", ["CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT",
                                 "GPU_CORE_UTILIZATION_POLICY", "LD_PRELOAD", "CUDA_MPS_PIPE_DIRECTORY",
                                 "ACTIVE_OOM_KILLER"])
def test_limit_switches_are_refused(key: str) -> None:
    (refusal,) = configmap_writes.config_map_refusals(NS, "settings", [key, "PORT"], readers())
    assert f"key {key} would set {key}" in refusal.message


@pytest.mark.parametrize("keys", [["LOG_LEVEL", "PORT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"],
                                  ["config.yaml", "ca.crt"], []])
def test_ordinary_keys_pass(keys: list[str]) -> None:
    assert configmap_writes.config_map_refusals(NS, "settings", keys, readers()) == []


def test_every_refused_variable_is_named_once_per_key() -> None:
    found = configmap_writes.config_map_refusals(NS, "settings", ["LD_PRELOAD", "NVIDIA_VISIBLE_DEVICES"],
                                          [*readers(), *readers(where="init container 'setup'", name="a-0")])
    assert [f.message.split(" would set ")[1].split(" ")[0] for f in found] == ["LD_PRELOAD", "NVIDIA_VISIBLE_DEVICES"]
    assert all("GPU pod team-a/a-0" in f.message and "init container 'setup'" in f.message for f in found)


@pytest.mark.parametrize("prefix", ["", "NVIDIA_", "CUDA_", "GPU_", "LD_", "APP_", "N", "CUDA_DEVICE_", "X_"])
@pytest.mark.parametrize("key", ["VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "PRELOAD", "MEMORY_LIMIT", "DEVICE_X",
                                 "MPS_PIPE_DIRECTORY", "DEVICE_ORDER", "HOST", "IDIA_VISIBLE_DEVICES", "FOO"])
def test_a_write_is_refused_exactly_when_the_admission_of_its_reader_would_be(prefix: str, key: str) -> None:
    """The two paths call one rule: a GPU pod whose ConfigMap held the key at admission is refused there
    iff the write that adds the key while the pod runs is refused here."""
    spec = pod("train-0", prefix=prefix)["spec"]
    at_admission = Snapshot(config_maps={NS: {"settings": envfrom.env_from_keys({key: "x"})}})
    violations, _ = envfrom.env_from(spec, NS, at_admission, gpu_pod=True)
    refused = configmap_writes.config_map_refusals(NS, "settings", [key], readers(prefix))
    assert bool(refused) == bool(violations)


# --------------------------------------------------------------------------- the decision on a write


def test_a_write_reaching_a_live_gpu_pod_is_refused() -> None:
    snapshot = snapshot_of(pod("train-0"), config_map(data={"LOG_LEVEL": "info"}))
    old = config_map(data={"LOG_LEVEL": "info"})
    new = config_map(data={"LOG_LEVEL": "info", "NVIDIA_VISIBLE_DEVICES": "all"})
    decision = decide(write(new, old), snapshot)
    assert (decision.allowed, decision.code, decision.reason) == (False, 403, "isolation-env-configmap")
    assert decide(write(config_map(data={"LOG_LEVEL": "debug"}), old), snapshot).allowed


def test_recreating_a_deleted_config_map_is_a_create_and_is_checked() -> None:
    snapshot = snapshot_of(pod("train-0", prefix="CUDA_"))  # the ConfigMap is gone; the pod still runs
    decision = decide(write(config_map(data={"DEVICE_MEMORY_LIMIT": "0"})), snapshot)
    assert (decision.allowed, decision.reason) == (False, "isolation-env-configmap")
    assert "CUDA_DEVICE_MEMORY_LIMIT" in decision.message
    assert decide(write(config_map(data={"HOME": "/root"})), snapshot).allowed


@pytest.mark.parametrize("reader", [
    pod("cpu-0", gpus=None),  # no GPU: NVIDIA_VISIBLE_DEVICES=void beats envFrom, no limit library
    pod("done-0", phase="Succeeded"),  # restarts nothing
    pod("app-0", prefix="APP_"),  # no isolation variable starts with APP_
    pod("other-0", config_map="other"),  # reads another ConfigMap
    pod("elsewhere-0", namespace="foo"),  # another namespace
])
def test_writes_no_live_gpu_pod_reads_pass(reader: dict[str, Any]) -> None:
    snapshot = snapshot_of(reader)
    decision = decide(write(config_map(data={"NVIDIA_VISIBLE_DEVICES": "all", "LD_PRELOAD": "/x.so"})), snapshot)
    assert decision.allowed and decision.reason == "no-gpu-reader"


def test_unmanaged_namespaces_and_unchanged_data_pass() -> None:
    bad = {"GPU_CORE_UTILIZATION_POLICY": "disable"}
    snapshot = snapshot_of(pod("train-0"), pod("loose-0", namespace="loose"))
    assert decide(write(config_map(data=bad, namespace="loose")), snapshot).reason == "not-managed"
    # A label edit changes no variable (a ConfigMap can hold such a key only from before the webhook).
    labelled = config_map(data=bad)
    labelled["metadata"]["labels"] = {"team": "a"}
    assert decide(write(labelled, config_map(data=bad)), snapshot).reason == "data-unchanged"
    assert not decide(write(config_map(data={**bad, "X": "1"}), config_map(data=bad)), snapshot).allowed
    assert decide(write(config_map(data=None)), snapshot).allowed
    malformed = config_map()
    malformed["data"] = ["NVIDIA_VISIBLE_DEVICES"]
    assert (decide(write(malformed), snapshot).code, decide(write(malformed), snapshot).allowed) == (400, False)


# --------------------------------------------------------------------------- the watch cache


def test_the_cache_keeps_and_forgets_readers_as_pods_come_and_go() -> None:
    cache = ClusterCache()
    cache.replace("namespaces", [o for o in cluster_objects() if o["kind"] == "Namespace"])
    cache.replace("pods", [pod("train-0", prefix="NVIDIA_"), pod("cpu-0", gpus=None)])
    for kind in ("nodes", "gpuinventories", "resourcequotas", "resourceclaims", "resourceclaimtemplates",
                 "configmaps"):
        cache.replace(kind, [])
    first = cache.snapshot()
    assert first.env_readers == {NS: {"settings": (EnvReader("NVIDIA_", "container 'main'", "train-0", 1),)}}
    cache.apply("pods", "ADDED", pod("train-1", prefix="NVIDIA_"))
    cache.apply("pods", "ADDED", pod("train-2", container="sidecar"))
    second = cache.snapshot()
    assert second.env_readers[NS]["settings"] == (EnvReader("", "container 'sidecar'", "train-2", 1),
                                                  EnvReader("NVIDIA_", "container 'main'", "train-0", 2))
    assert first.env_readers[NS]["settings"] == (EnvReader("NVIDIA_", "container 'main'", "train-0", 1),)
    cache.apply("pods", "DELETED", pod("train-0"))
    cache.apply("pods", "MODIFIED", pod("train-2", container="sidecar", phase="Failed"))
    assert cache.snapshot().env_readers == {NS: {"settings": (EnvReader("NVIDIA_", "container 'main'", "train-1", 1),)}}
    # A status update that changes no read publishes nothing new.
    third = cache.snapshot()
    cache.apply("pods", "MODIFIED", pod("train-1", prefix="NVIDIA_"))
    assert cache.snapshot().env_readers is third.env_readers
    cache.apply("pods", "DELETED", pod("train-1"))
    assert cache.snapshot().env_readers == {}
    # A re-list forgets the pods it no longer holds.
    cache.replace("pods", [pod("x-0", namespace="foo")])
    assert set(cache.snapshot().env_readers) == {"foo"}
    cache.replace("pods", [])
    assert cache.snapshot().env_readers == {}


def test_the_cache_publishes_what_build_snapshot_builds() -> None:
    pods = [pod("train-0", prefix="NVIDIA_"), pod("train-1", prefix="NVIDIA_"), pod("cpu-0", gpus=None),
            pod("b-0", config_map="other", namespace="foo"), pod("done", phase="Succeeded")]
    cache = ClusterCache()
    cache.replace("pods", list(reversed(pods)))
    built = build_snapshot(pods)
    assert cache.snapshot().env_readers == built.env_readers
    assert built.env_readers[NS]["settings"] == (EnvReader("NVIDIA_", "container 'main'", "train-0", 2),)


# --------------------------------------------------------------------------- the server


def answer(endpoint: str, request: dict[str, Any], *objects: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    config = ServerConfig(source=StaticSource(snapshot_of(*objects)), namespace="gpu-admission", core=real_core(),
                          policy=PolicyHolder(None, loader=lambda _path: Policy()))
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    response = create_app(config).test_client().post(endpoint, data=json.dumps(review),
                                                     content_type="application/json")
    body: dict[str, Any] = response.get_json()
    return response.status_code, body.get("response", body)


def test_the_server_refuses_an_edit_that_reaches_a_running_gpu_pod() -> None:
    old = config_map(data={"PORT": "80"})
    new = config_map(data={"PORT": "80", "VISIBLE_DEVICES": "all"})
    reader = pod("train-0", prefix="NVIDIA_")
    for dry_run in (False, True):
        status, refused = answer("/validate", write(new, old, dry_run=dry_run), reader)
        assert status == 200
        assert (refused["allowed"], refused["status"]["code"], refused["status"]["reason"]) == (
            False, 403, "isolation-env-configmap")
        assert "NVIDIA_VISIBLE_DEVICES" in refused["status"]["message"]
    assert answer("/validate", write(config_map(data={"PORT": "81"}), old), reader)[1] == {"uid": "u-cm",
                                                                                          "allowed": True}
    # The mutating webhook, DELETE, the webhook's own namespace: nothing to decide.
    assert answer("/mutate", write(new, old), reader)[1]["allowed"] is True
    delete = {**write(new, old), "operation": "DELETE", "object": None}
    assert answer("/validate", delete, reader)[1]["allowed"] is True
    own = write(config_map(data={"NVIDIA_VISIBLE_DEVICES": "all"}, namespace="gpu-admission"))
    assert answer("/validate", own, pod("x", namespace="gpu-admission"))[1]["allowed"] is True


def test_a_config_map_write_without_its_object_is_a_bad_request() -> None:
    request = write(config_map(data={"A": "b"}))
    del request["object"]
    status, body = answer("/validate", request, pod("train-0"))
    assert status == 400 and body["code"] == 400 and "ConfigMap" in body["message"]


# --------------------------------------------------------------------------- the chart


@pytest.fixture(scope="module")
def hooks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict[str, Any]]]:
    helm = helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))
    found = {}
    for version in ("1.34", "1.29"):
        docs = helm.template(kube_version=f"{version}.0")
        found[version] = {w["name"]: w for d in docs if d["kind"] == "ValidatingWebhookConfiguration"
                          for w in d["webhooks"]}
    return found


def test_the_chart_registers_config_map_writes(hooks: dict[str, dict[str, dict[str, Any]]]) -> None:
    hook = hooks["1.34"][HOOK]
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                              "resources": ["configmaps"], "scope": "Namespaced"}]
    assert hook["clientConfig"]["service"]["path"] == "/validate"
    assert hook["namespaceSelector"] == hooks["1.34"]["validate-pods.gpu-admission.io"]["namespaceSelector"]
    names = hook["namespaceSelector"]["matchExpressions"][0]
    assert names["operator"] == "NotIn" and "kube-system" in names["values"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "NoneOnDryRun"
    # Without matchConditions every ConfigMap write would come: fail open then.
    old = hooks["1.29"][HOOK]
    assert "matchConditions" not in old and old["failurePolicy"] == "Ignore"


@pytest.fixture(scope="module")
def sent(hooks: dict[str, dict[str, dict[str, Any]]]) -> Any:
    env = celpy.Environment()
    programs = [env.program(env.compile(c["expression"])) for c in hooks["1.34"][HOOK]["matchConditions"]]

    def evaluate(new: dict[str, Any], old: dict[str, Any] | None = None) -> bool:
        activation = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old),
                      "request": celpy.json_to_cel({"operation": "CREATE" if old is None else "UPDATE"})}
        return all(bool(p.evaluate(activation)) for p in programs)

    return evaluate


def test_only_writes_of_env_style_keys_are_sent(sent: Any) -> None:
    assert sent(config_map(data={"NVIDIA_VISIBLE_DEVICES": "all"}))
    assert sent(config_map(data={"config.yaml": "a: 1", "LOG_LEVEL": "info"}))
    assert not sent(config_map(data={"config.yaml": "a: 1", "ca.crt": "x"}))
    assert not sent(config_map()) and not sent(config_map(data={}))
    assert sent(config_map(data={"_MPS_x.y": "1"}))  # starts with a tail of CUDA_MPS_: any rest counts
    before = config_map(data={"PORT": "80"})
    labelled = copy.deepcopy(before)
    labelled["metadata"]["labels"] = {"a": "b"}
    assert not sent(labelled, before)
    assert sent(config_map(data={"PORT": "81"}), before)
    assert sent(config_map(data={"PORT": "80"}), config_map())


def test_every_key_the_webhook_decides_on_is_sent(sent: Any) -> None:
    """Whatever key `env_from_keys` keeps (some prefix could make it an isolation variable) passes the
    chart's condition, so no write the server would refuse is left unsent."""
    keys = set(envfrom._TAILS)
    keys |= {tail + rest for tail in envfrom._FAMILY_TAILS for rest in ("", "x", ".conf", "0", "-a")}
    assert keys == set(envfrom.env_from_keys(dict.fromkeys(keys)))
    for key in sorted(keys):
        assert sent(config_map(data={"config.yaml": "", key: "1"})), key
