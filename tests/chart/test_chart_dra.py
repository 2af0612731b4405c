"""The chart's webhook for DRA claims: its matchConditions expression, evaluated with a CEL interpreter."""

from __future__ import annotations

from typing import Any

import celpy
import helm_tool
import pytest


@pytest.fixture(scope="module")
def sends(tmp_path_factory: pytest.TempPathFactory) -> Any:
    helm = helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))
    docs = helm.template(kube_version="1.34.0")
    hooks = [w for d in docs if d["kind"] == "ValidatingWebhookConfiguration" for w in d["webhooks"]
             if w["name"] == "validate-resourceclaims.gpu-admission.io"]
    assert len(hooks) == 1
    env = celpy.Environment()
    programs = [env.program(env.compile(c["expression"])) for c in hooks[0]["matchConditions"]]

    def evaluate(operation: str, obj: dict[str, Any], old: dict[str, Any] | None) -> bool:
        activation = {"request": celpy.json_to_cel({"operation": operation}), "object": celpy.json_to_cel(obj),
                      "oldObject": celpy.json_to_cel(old)}
        return all(bool(p.evaluate(activation)) for p in programs)

    return evaluate


CLAIM = {"metadata": {"name": "c"}, "spec": {"devices": {"requests": [{"name": "g", "exactly": {
    "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]}}}


def test_creates_and_spec_changes_are_sent_metadata_updates_are_not(sends: Any) -> None:
    assert sends("CREATE", CLAIM, None)
    finalised = {**CLAIM, "metadata": {"name": "c", "finalizers": ["resource.kubernetes.io/delete-protection"]}}
    assert not sends("UPDATE", finalised, CLAIM)
    changed = {**CLAIM, "spec": {"devices": {"requests": []}}}
    assert sends("UPDATE", changed, CLAIM)


def agent_container(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def test_the_agent_reads_the_toolkit_config_of_its_node_read_only(tmp_path_factory: pytest.TempPathFactory) -> None:
    helm = helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))
    pod, container = agent_container(helm.template())
    assert "--toolkit-config=/etc/nvidia-container-runtime/config.toml" in container["args"]
    assert {"name": "toolkit-config", "mountPath": "/etc/nvidia-container-runtime", "readOnly": True} in container[
        "volumeMounts"]
    assert {"name": "toolkit-config", "hostPath": {"path": "/etc/nvidia-container-runtime",
                                                   "type": "DirectoryOrCreate"}} in pod["volumes"]
    operator = "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"
    pod, container = agent_container(helm.template({"agent": {"toolkitConfig": operator}}))
    assert f"--toolkit-config={operator}" in container["args"]
    assert pod["volumes"][-1]["hostPath"]["path"] == "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime"
    pod, container = agent_container(helm.template({"agent": {"toolkitConfig": ""}}))
    assert "--toolkit-config=" in container["args"] and all(v["name"] != "toolkit-config" for v in pod["volumes"])
    with pytest.raises(helm_tool.HelmError, match="toolkitConfig"):
        helm.template({"agent": {"toolkitConfig": "relative/config.toml"}})
