"""The chart's matchConditions send every pod the server's fast path decides (`needs_decision`): pods
that set a limit-layer switch, take envFrom, tolerate a GPU node's taint or name a node."""

from __future__ import annotations

from typing import Any

import celpy
import helm_tool
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.podspec.fastpath import needs_decision


@pytest.fixture(scope="module")
def may_use_gpu(tmp_path_factory: pytest.TempPathFactory) -> Any:
    helm = helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))
    docs = helm.template(kube_version="1.34.0")
    expressions = {c["expression"] for d in docs if d["kind"].endswith("WebhookConfiguration")
                   for w in d["webhooks"] if w["rules"][0]["resources"] == ["pods"]
                   and w["rules"][0]["operations"] == ["CREATE"] for c in w["matchConditions"]}
    assert len(expressions) == 1
    env = celpy.Environment()
    program = env.program(env.compile(expressions.pop()))
    return lambda pod: bool(program.evaluate({"object": celpy.json_to_cel(pod)}))


def pod(containers: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": containers or [{"name": "app", "image": "busybox"}], **spec}}


@pytest.mark.parametrize("name", ["GPU_CORE_UTILIZATION_POLICY", "ACTIVE_OOM_KILLER", "CUDA_DISABLE_CONTROL",
                                  "CUDA_TASK_PRIORITY", "CUDA_REDIRECT", "CUDA_OVERSUBSCRIBE"])
def test_pods_setting_a_switch_of_the_limit_layer_are_sent(may_use_gpu: Any, name: str) -> None:
    assert may_use_gpu(pod([{"name": "a", "image": "x", "env": [{"name": name, "value": "x"}]}]))


def test_env_from_tolerations_and_node_name_are_sent(may_use_gpu: Any) -> None:
    assert may_use_gpu(pod([{"name": "a", "image": "x", "envFrom": [{"secretRef": {"name": "s"}}]}]))
    assert may_use_gpu(pod(initContainers=[{"name": "i", "image": "x", "envFrom": [{"configMapRef": {"name": "c"}}]}]))
    assert may_use_gpu(pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]))
    assert may_use_gpu(pod(tolerations=[{"operator": "Exists"}]))
    assert may_use_gpu(pod(nodeName="gpu-1"))
    ordinary = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                {"key": "CriticalAddonsOnly", "operator": "Exists"}]
    assert not may_use_gpu(pod(tolerations=ordinary))


TOLERATIONS = st.sampled_from([
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Exists"},
    {"key": "dedicated", "operator": "Equal", "value": "gpu"},
    {"operator": "Exists"},
])
CONTAINERS = st.builds(
    lambda env, env_from: {"name": "c", "image": "i", **({"env": env} if env else {}),
                           **({"envFrom": [{"configMapRef": {"name": "m"}}]} if env_from else {})},
    st.lists(st.builds(lambda n: {"name": n, "value": "1"}, st.sampled_from(
        ["PATH", "LD_PRELOAD", "ACTIVE_OOM_KILLER", "CUDA_REDIRECT", "CUDA_VISIBLE_DEVICES", "NVIDIA_GDS"])),
        max_size=2),
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(containers=st.lists(CONTAINERS, min_size=1, max_size=2), tolerations=st.lists(TOLERATIONS, max_size=2),
       node_name=st.sampled_from([None, "", "n1"]), runtime=st.sampled_from([None, "nvidia", "kata"]))
def test_every_pod_the_fast_path_decides_reaches_the_webhook(
    may_use_gpu: Any, containers: list[dict[str, Any]], tolerations: list[dict[str, Any]], node_name: str | None,
    runtime: str | None,
) -> None:
    spec: dict[str, Any] = {}
    if tolerations:
        spec["tolerations"] = tolerations
    if node_name is not None:
        spec["nodeName"] = node_name
    if runtime is not None:
        spec["runtimeClassName"] = runtime
    candidate = pod(containers, **spec)
    # The fast path sends every RuntimeClass to the core, which acts on the GPU ones only (nvidia*): the
    # chart need not send the others.
    acted_on = pod(containers, **{k: v for k, v in spec.items() if (k, v) != ("runtimeClassName", "kata")})
    if needs_decision(acted_on):
        assert may_use_gpu(candidate), candidate
