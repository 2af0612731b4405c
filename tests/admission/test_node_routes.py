"""Routes the node's NVIDIA container toolkit opens or closes: the agent reports the setting, the
inventory carries it, the webhook reads it, and the device-list mount route is refused everywhere."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import fake_nvml
import pytest
from builders import H100, node, pod, snapshot
from fake_custom_objects import FakeCustomObjects

from webhook.agent.metrics import AgentMetrics
from webhook.agent.publish import InventoryPublisher, inventory_status
from webhook.agent.toolkit import ToolkitConfigError, read_toolkit
from webhook.cluster.cache import ClusterCache
from webhook.cluster.translate import build_snapshot
from webhook.commands import agent as agent_main
from webhook.core.admission import admit
from webhook.core.admission.node_routes import device_list_mounts, limit_layer_mounts, pinned_nodes
from webhook.core.podspec.inventory import InventoryError, check_inventory
from webhook.core.policy.model import Policy

HARDENED = """\
accept-nvidia-visible-devices-envvar-when-unprivileged = false
accept-nvidia-visible-devices-as-volume-mounts = true

[nvidia-container-runtime]
mode = "auto"
"""


# ------------------------------------------------------------------------------------------ the agent


def test_the_toolkit_config_is_read_as_the_toolkit_reads_it(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(HARDENED)
    assert read_toolkit(str(config)) == {
        "configPath": str(config), "acceptEnvvarUnprivileged": False, "acceptVolumeMounts": True, "mode": "auto"}
    config.write_text("[nvidia-container-cli]\nldconfig = '@/sbin/ldconfig'\n")  # keys left out: the defaults
    assert read_toolkit(str(config)) == {
        "configPath": str(config), "acceptEnvvarUnprivileged": True, "acceptVolumeMounts": False}
    assert read_toolkit(str(tmp_path / "absent.toml")) is None  # unknown, never a guess
    config.write_text("accept-nvidia-visible-devices-envvar-when-unprivileged = 'no'\n")
    with pytest.raises(ToolkitConfigError, match="envvar-when-unprivileged must be true or false, got 'no'"):
        read_toolkit(str(config))
    config.write_text("accept = \n")
    with pytest.raises(ToolkitConfigError, match=r"config\.toml: not valid TOML"):
        read_toolkit(str(config))


def agent(tmp_path: Path, toolkit: str) -> tuple[agent_main.Agent, FakeCustomObjects, io.StringIO]:
    nvml = fake_nvml.pcie_box()
    nvml.nvmlInit()
    api, err = FakeCustomObjects(), io.StringIO()
    return (agent_main.Agent(nvml, "n1", InventoryPublisher(api, "n1"), AgentMetrics(nvml, "n1"), io.StringIO(),
                             err, toolkit_config=toolkit), api, err)


def test_the_agent_publishes_the_toolkit_setting_with_the_inventory(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(HARDENED)
    runner, api, _ = agent(tmp_path, str(config))
    assert runner.run_pass() == "created"
    written = api.objects["n1"]
    assert written["spec"]["toolkit"]["acceptEnvvarUnprivileged"] is False
    assert written["status"]["visibleDevicesEnvvar"] == "ignored"
    check_inventory(written["spec"])  # what the webhook's guard and the cache accept
    config.write_text("")  # the node went back to the toolkit's defaults
    assert runner.run_pass() == "replaced"
    assert api.objects["n1"]["status"]["visibleDevicesEnvvar"] == "accepted"


def test_no_config_or_a_broken_one_reports_unknown(tmp_path: Path) -> None:
    runner, api, err = agent(tmp_path, str(tmp_path / "missing.toml"))
    runner.run_pass()
    assert "toolkit" not in api.objects["n1"]["spec"] and "visibleDevicesEnvvar" not in api.objects["n1"]["status"]
    (tmp_path / "bad.toml").write_text("= 1")
    runner, api, err = agent(tmp_path, str(tmp_path / "bad.toml"))
    assert runner.run_pass() == "created" and "toolkit" not in api.objects["n1"]["spec"]
    assert "not valid TOML" in err.getvalue() and "reported as unknown" in err.getvalue()


def test_the_option_names_the_file() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    agent_main.add_arguments(parser)
    assert parser.parse_args([]).toolkit_config == "/etc/nvidia-container-runtime/config.toml"
    assert parser.parse_args(["--toolkit-config", ""]).toolkit_config == ""


# ------------------------------------------------------------------------------------------ inventory and cache


SPEC: dict[str, Any] = {
    "version": 1,
    "gpus": [{"index": 0, "uuid": "GPU-0", "model": "NVIDIA-H100-80GB-HBM3", "memoryMiB": 81559, "numa": 0,
              "healthy": True}],
    "nvlink": [[0]],
    "pcie": [["X"]],
}


def test_the_inventory_checks_the_toolkit_field() -> None:
    check_inventory({**SPEC, "toolkit": {"acceptEnvvarUnprivileged": False}})
    with pytest.raises(InventoryError, match=r"^spec\.toolkit\.acceptEnvvarUnprivileged: must be true or false"):
        check_inventory({**SPEC, "toolkit": {"acceptEnvvarUnprivileged": "false"}})
    with pytest.raises(InventoryError, match=r"^spec\.toolkit\.cdi: unknown field"):
        check_inventory({**SPEC, "toolkit": {"cdi": True}})


def cluster_objects(toolkit: dict[str, Any] | None) -> list[dict[str, Any]]:
    spec = dict(SPEC) if toolkit is None else {**SPEC, "toolkit": toolkit}
    return [
        {"kind": "Node", "metadata": {"name": "g1", "labels": {"kubernetes.io/hostname": "g1"}},
         "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}}},
        {"kind": "GPUInventory", "metadata": {"name": "g1"}, "spec": spec},
    ]


@pytest.mark.parametrize(("toolkit", "expected"), [
    ({"acceptEnvvarUnprivileged": False, "acceptVolumeMounts": True}, False),
    ({"acceptEnvvarUnprivileged": True}, True),
    (None, None),
])
def test_the_snapshot_node_carries_the_setting(toolkit: dict[str, Any] | None, expected: bool | None) -> None:
    objects = cluster_objects(toolkit)
    assert build_snapshot(objects).nodes["g1"].toolkit_envvar is expected
    cache = ClusterCache(clock=lambda: 0.0)
    cache.replace("nodes", [objects[0]])
    cache.replace("gpuinventories", [objects[1]])
    assert cache.snapshot().nodes["g1"].toolkit_envvar is expected


# ------------------------------------------------------------------------------------------ the webhook


def cluster(envvar: bool | None) -> Any:
    base = snapshot(node("h1", H100, 8))
    h1 = dataclasses.replace(base.nodes["h1"], toolkit_envvar=envvar,
                             labels={**base.nodes["h1"].labels, "kubernetes.io/hostname": "h1"})
    return dataclasses.replace(base, nodes={"h1": h1})


def device_mount_pod(gpus: int = 0) -> dict[str, Any]:
    p = pod({"nvidia.com/gpu": gpus} if gpus else None, volumes=[{"name": "n", "hostPath": {"path": "/dev/null"}}])
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "n", "mountPath": "/var/run/nvidia-container-devices/all"}]
    return p


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_device_list_mount_is_refused(gpus: int) -> None:
    """hostPath /dev/null at /var/run/nvidia-container-devices/all is every GPU of a node that accepts
    device lists as volume mounts (the device plugin's volume-mounts strategy)."""
    decision = admit.mutate(device_mount_pod(gpus), cluster(False), Policy())
    assert not decision.allowed and (decision.code, decision.reason) == (403, "isolation-device-mount")
    assert decision.message.startswith("container 'main' mounts /var/run/nvidia-container-devices/all")
    assert not admit.validate(device_mount_pod(gpus), cluster(False), Policy()).allowed


def test_device_list_mounts_are_found_however_written() -> None:
    init = {"name": "i", "volumeMounts": [{"name": "n", "mountPath": "//run/nvidia-container-devices/"}]}
    debug = {"name": "e", "volumeMounts": [{"name": "n", "mountPath": "/var/run/x/../nvidia-container-devices/GPU-1"}]}
    p = pod(initContainers=[init], ephemeralContainers=[debug])
    assert device_list_mounts(p) == [
        "init container 'i' mounts //run/nvidia-container-devices/",
        "ephemeral container 'e' mounts /var/run/x/../nvidia-container-devices/GPU-1",
    ]
    assert device_list_mounts(pod(volumes=[])) == []


def test_the_server_fast_path_sends_device_list_mounts_to_the_decision() -> None:
    from webhook.server.admission import real_core

    assert real_core().needs_decision(device_mount_pod())


def test_a_gpu_pod_pinned_to_a_node_that_honours_the_variable_is_warned() -> None:
    pinned = pod({"nvidia.com/gpu": 1}, nodeSelector={"kubernetes.io/hostname": "h1"})
    decision = admit.mutate(pinned, cluster(True), Policy())
    assert decision.allowed
    assert [w for w in decision.warnings if "NVIDIA_VISIBLE_DEVICES" in w] == [
        "node h1: its NVIDIA toolkit honours NVIDIA_VISIBLE_DEVICES in unprivileged containers (docs/install.md)"]
    for envvar in (False, None):  # closed at the node, or unknown: nothing to say
        quiet = admit.mutate(pinned, cluster(envvar), Policy())
        assert quiet.allowed and not any("NVIDIA_VISIBLE_DEVICES" in w for w in quiet.warnings)


def test_pinned_nodes() -> None:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["a", "b"]}]}
    fields = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}
    anywhere = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}

    def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}

    assert pinned_nodes(pod(affinity=affinity(term, fields))) == ("a", "b", "c")
    assert pinned_nodes(pod(affinity=affinity(term, anywhere))) == ()
    assert pinned_nodes(pod(nodeName="n")) == ("n",)


def test_a_pod_named_onto_a_node_that_ignores_the_variable_needs_no_neutralising() -> None:
    """No GPU asked, spec.nodeName of a GPU node: the image's NVIDIA_VISIBLE_DEVICES=all would reach every
    GPU there unless the node's toolkit ignores it in unprivileged containers."""
    web = pod(nodeName="h1")
    opened = admit.mutate(web, cluster(True), Policy())
    assert opened.allowed and opened.reason == "neutralised"
    assert any(op["path"].endswith("/env") for op in opened.patch)
    closed = admit.mutate(web, cluster(False), Policy())
    assert closed.allowed and closed.reason == "not-gpu-pod" and closed.patch == ()
    assert admit.mutate(web, cluster(None), Policy()).reason == "neutralised"  # unknown: as before


def test_the_inventory_with_the_toolkit_is_accepted_by_the_write_guard() -> None:
    from webhook.core.admission.inventory_guard import check_inventory_write

    obj = {"apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUInventory", "metadata": {"name": "g1"},
           "spec": {**SPEC, "toolkit": {"acceptEnvvarUnprivileged": False}}}
    request = {"operation": "CREATE", "object": obj, "name": "g1",
               "userInfo": {"username": "system:serviceaccount:gpu-admission:gpu-admission-agent",
                            "extra": {"authentication.kubernetes.io/node-name": ["g1"]}}}
    assert check_inventory_write(request).allowed, json.dumps(request)
    assert inventory_status(obj["spec"], "")["visibleDevicesEnvvar"] == "ignored"


# ------------------------------------------------------------------------------------------ the limit layer


def mounting(path: str, gpus: int = 1, where: str = "containers") -> dict[str, Any]:
    p = pod({"nvidia.com/gpu": gpus} if gpus else None, volumes=[{"name": "v", "emptyDir": {}}])
    mount = {"name": "v", "mountPath": path}
    if where == "containers":
        p["spec"]["containers"][0]["volumeMounts"] = [mount]
    else:
        p["spec"]["initContainers"] = [{"name": "setup", "image": "busybox", "volumeMounts": [mount]}]
    return p


@pytest.mark.parametrize("path", ["/etc/ld.so.preload", "//etc/ld.so.preload", "/etc/./ld.so.preload", "/etc",
                                  "/etc/", "/usr/local", "/usr", "/usr/local/vgpu", "/usr/local/vgpu/libvgpu.so",
                                  "/usr/local/x/../vgpu"])
def test_a_gpu_pod_cannot_cover_the_limit_layer(path: str) -> None:
    """HAMi's device plugin injects the limits through /etc/ld.so.preload and /usr/local/vgpu; the kubelet
    mounts the pod's own volumes after the plugin's, so a volume there is laid over them."""
    for where in ("containers", "initContainers"):
        decision = admit.mutate(mounting(path, where=where), cluster(None), Policy())
        assert not decision.allowed and (decision.code, decision.reason) == (403, "isolation-limit-mount")
        assert f"mounts a volume at {path}" in decision.message
        assert not admit.validate(mounting(path, where=where), cluster(None), Policy()).allowed


@pytest.mark.parametrize("path", ["/tmp", "/etc/config", "/etc/ssl/certs", "/usr/local/lib/app", "/data",
                                  "/usr/share/models", "/dev/shm"])
def test_ordinary_mounts_of_a_gpu_pod_pass(path: str) -> None:
    decision = admit.mutate(mounting(path), cluster(None), Policy())
    assert decision.allowed, decision.message


def test_a_pod_without_gpus_may_mount_over_etc() -> None:
    """No limit layer is injected where no GPU is given."""
    assert limit_layer_mounts(mounting("/etc", gpus=0)) == ["container 'main' mounts a volume at /etc"]
    assert admit.mutate(mounting("/etc", gpus=0), cluster(None), Policy()).allowed
