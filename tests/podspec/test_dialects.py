"""Public HAMi, Volcano and KAI manifests (tests/fixtures/manifests, tests/fixtures/dialects), unchanged,
through mutate, the JSON patch and validate, as the API server chains them: the exact limits, resources,
annotation and warnings each dialect's pod ends up with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonpatch
import yaml
from builders import A100, node, snapshot

from webhook.core.admission import admit
from webhook.core.podspec.fastpath import needs_decision
from webhook.core.podspec.record import ANNOTATION
from webhook.core.policy.model import Policy

FIXTURES = Path(__file__).parent.parent / "fixtures"
CLUSTER = snapshot(node("a1", A100, 8))
CARD = A100[1]


def template(name: str, index: int = 0) -> dict[str, Any]:
    """The index-th pod (or workload's pod template) of a fixture file, in a managed namespace."""
    folder = "dialects" if name.startswith("kai-scheduler-docs-gpu-sharing-gpu-sharing-") else "manifests"
    pods = []
    for doc in yaml.safe_load_all((FIXTURES / folder / name).read_text()):
        if not doc:
            continue
        spec = doc.get("spec", {})
        if doc["kind"] == "Pod":
            pods.append(doc)
        elif doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            pods.append({"apiVersion": "v1", "kind": "Pod", **spec["template"]})
    found = pods[index]
    found.setdefault("metadata", {})
    found["metadata"].setdefault("name", "p")
    found["metadata"]["namespace"] = "team-a"
    return found


def chain(p: dict[str, Any]) -> tuple[Any, dict[str, Any], Any]:
    m = admit.mutate(p, CLUSTER, Policy())
    assert m.allowed, m.message
    patched = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    patched["metadata"]["uid"] = "uid-1"
    v = admit.validate(patched, CLUSTER, Policy())
    assert v.allowed, v.message
    return m, patched, v


def limits_env(patched: dict[str, Any], index: int = 0, init: bool = False) -> list[dict[str, str]]:
    container = patched["spec"]["initContainers" if init else "containers"][index]
    return [e for e in container.get("env", []) if e["name"].startswith("CUDA_")]


def slice_of(patched: dict[str, Any]) -> tuple[int, int]:
    record = json.loads(patched["metadata"]["annotations"][ANNOTATION])
    return record["memoryMiB"], record["cores"]


def memory_env(*mib: int) -> list[dict[str, str]]:
    return [{"name": f"CUDA_DEVICE_MEMORY_LIMIT_{i}", "value": f"{m}m"} for i, m in enumerate(mib)]


def memory_only_env(*mib: int) -> list[dict[str, str]]:
    """A memory slice with no compute cap: SM limit 0, which HAMi-core reads as none (as HAMi writes it)."""
    return [*memory_env(*mib), {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}]


# --- HAMi -------------------------------------------------------------------------------------------


def test_hami_default_use_memory_and_cores() -> None:
    _, patched, _ = chain(template("hami-examples-nvidia-default_use.yaml"))
    assert limits_env(patched) == [*memory_env(3000), {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"}]
    assert patched["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert slice_of(patched) == (3000, 30)


def test_hami_example_memory_only_has_no_compute_cap() -> None:
    _, patched, _ = chain(template("hami-examples-nvidia-example.yaml"))
    assert limits_env(patched) == memory_only_env(3000)
    assert slice_of(patched) == (3000, 0)


def test_hami_memory_fraction_on_two_gpus() -> None:
    _, patched, _ = chain(template("hami-examples-nvidia-use_memory_fraction.yaml"))
    half = CARD // 2
    assert limits_env(patched) == [*memory_env(half, half), {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"}]


def test_hami_sharing_card_pods_each_get_their_percentages() -> None:
    for index, (memory, cores) in enumerate(((40, 60), (60, 40))):
        _, patched, _ = chain(template("hami-examples-nvidia-use_sharing_card.yaml", index))
        assert limits_env(patched) == [*memory_env(CARD * memory // 100),
                                       {"name": "CUDA_DEVICE_SM_LIMIT", "value": str(cores)}]


def test_hami_vllm_requests_and_limits_both_lose_the_slice_fields() -> None:
    _, patched, _ = chain(template("hami-examples-nvidia-vllm_cross_vgpu.yaml", 0))
    resources = patched["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == 2
    assert not {"nvidia.com/gpumem-percentage", "nvidia.com/gpucores"} & (resources["limits"].keys()
                                                                           | resources["requests"].keys())
    share = CARD * 30 // 100
    assert limits_env(patched) == [*memory_env(share, share), {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"}]


def test_hami_dynamic_mig_example_gets_memory_slices_and_a_mode_warning() -> None:
    m, patched, _ = chain(template("hami-examples-nvidia-dynamic_mig_example.yaml"))
    assert limits_env(patched) == memory_only_env(8000, 8000)
    assert m.warnings == ("annotation nvidia.com/vgpu-mode='mig': limits are enforced with hami-core here",)


def test_hami_scheduling_policy_annotations_are_understood() -> None:
    m, patched, _ = chain(template("hami-examples-nvidia-specify_scheduling_policy.yaml"))
    assert m.warnings == ()
    assert json.loads(patched["metadata"]["annotations"][ANNOTATION])["policy"] == "spread"


def test_kueue_hami_sample_with_string_values() -> None:
    _, patched, _ = chain(template("kueue-site-examples-serving-workloads-sample-hami.yaml"))
    assert limits_env(patched) == [*memory_env(1024, 1024), {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"}]
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}


def test_hami_pod_under_hami_scheduler_keeps_what_hami_reads() -> None:
    p = template("hami-examples-nvidia-default_use.yaml")
    p["spec"]["schedulerName"] = "hami-scheduler"
    given = p["spec"]["containers"][0]["resources"]
    _, patched, _ = chain(p)
    assert patched["spec"]["containers"][0]["resources"] == given
    assert limits_env(patched) == [*memory_env(3000), {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"}]


# --- Volcano ----------------------------------------------------------------------------------------


def test_volcano_deployment_keeps_its_resources_and_gets_no_nvidia_count() -> None:
    p = template("volcano-vgpu-device-plugin-examples-vgpu-deployment.yaml")
    given = p["spec"]["containers"][0]["resources"]
    m, patched, v = chain(p)
    assert patched["spec"]["containers"][0]["resources"] == given  # volcano.sh/vgpu-number and -memory
    assert limits_env(patched) == memory_only_env(16384)
    assert slice_of(patched) == (16384, 0) and v.allocation == m.allocation


def test_volcano_three_containers_keep_their_resources() -> None:
    p = template("volcano-vgpu-device-plugin-examples-vgpu-case03.yml")
    given = [c.get("resources") for c in p["spec"]["containers"]]
    _, patched, _ = chain(p)
    assert [c.get("resources") for c in patched["spec"]["containers"]] == given
    assert limits_env(patched, 1) == []
    # Each container its own slice, as Volcano gives it; placement reserved the larger on each GPU.
    assert limits_env(patched, 0) == memory_only_env(2000, 2000)
    assert limits_env(patched, 2) == memory_only_env(3000, 3000)
    record = json.loads(patched["metadata"]["annotations"][ANNOTATION])
    assert record["containers"] == [
        {"name": "ubuntu-container", "init": False, "gpus": 2, "memoryMiB": 2000, "cores": 0},
        {"name": "ubuntu-container1", "init": False, "gpus": 2, "memoryMiB": 3000, "cores": 0},
    ]


def test_volcano_resources_under_the_default_scheduler_get_volcanos_own_count() -> None:
    p = template("volcano-vgpu-device-plugin-examples-vgpu-deployment.yaml")
    del p["spec"]["schedulerName"]
    del p["spec"]["containers"][0]["resources"]["limits"]["volcano.sh/vgpu-number"]
    _, patched, _ = chain(p)
    assert patched["spec"]["containers"][0]["resources"] == {"limits": {"volcano.sh/vgpu-number": "1"}}


# --- KAI --------------------------------------------------------------------------------------------


def test_kai_fraction_is_a_memory_share_without_a_compute_cap() -> None:
    _, patched, _ = chain(template("kai-scheduler-docs-gpu-sharing-gpu-sharing.yaml"))
    assert limits_env(patched) == memory_only_env(CARD // 2)
    assert "resources" not in patched["spec"]["containers"][0]  # KAI pods ask by annotation only


def test_kai_gpu_memory_is_a_memory_limit_only() -> None:
    _, patched, _ = chain(template("kai-scheduler-docs-gpu-sharing-gpu-memory.yaml"))
    assert limits_env(patched) == memory_only_env(2000)


def test_kai_fraction_goes_to_the_named_container() -> None:
    _, patched, _ = chain(template("kai-scheduler-docs-gpu-sharing-gpu-sharing-non-default-container.yaml"))
    assert [limits_env(patched, i) for i in range(3)] == [[], memory_only_env(CARD // 2), []]


def test_kai_fraction_goes_to_the_named_init_container() -> None:
    _, patched, _ = chain(template("kai-scheduler-docs-gpu-sharing-gpu-sharing-init-container.yaml"))
    assert limits_env(patched, 0, init=True) == memory_only_env(CARD // 2)
    assert limits_env(patched, 0) == []


def test_kai_fraction_naming_no_container_is_refused() -> None:
    p = template("kai-scheduler-docs-gpu-sharing-gpu-sharing-non-default-container.yaml")
    p["metadata"]["annotations"]["gpu-fraction-container-name"] = "gpu-wrkload"
    d = admit.mutate(p, CLUSTER, Policy())
    assert (d.allowed, d.code, d.reason) == (False, 422, "invalid-annotation")
    assert d.message == ("annotation gpu-fraction-container-name is 'gpu-wrkload', which names no container "
                         "of the pod; write the name of the container that uses the GPU")


# --- outside the vendor table ----------------------------------------------------------------------


def test_unknown_extended_gpu_resource_passes_with_a_warning_and_reaches_the_core() -> None:
    p = template("kueue-site-examples-dra-sample-dra-extended-resource-job.yaml")
    assert needs_decision(p)  # the server's fast path sends it to the core, which warns
    d = admit.mutate(p, CLUSTER, Policy())
    assert (d.allowed, d.patch) == (True, ())
    assert d.warnings == (
        "container 'dummy-job': example.com/gpu is not counted or limited by this controller; left alone",
    )
