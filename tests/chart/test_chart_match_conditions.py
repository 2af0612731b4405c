"""The chart's matchConditions expression, evaluated with a CEL interpreter against pods.

The API server skips the webhook for pods the expression rejects, so it must accept every pod the
server's own GPU-pod test (`is_gpu_pod`) accepts; anything less lets a GPU pod escape every check.
"""

from __future__ import annotations

from typing import Any

import celpy
import helm_tool
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.podspec.fastpath import is_gpu_pod


@pytest.fixture(scope="module")
def may_use_gpu(tmp_path_factory: pytest.TempPathFactory) -> Any:
    helm = helm_tool.Helm(helm_tool.find_helm(), tmp_path_factory.mktemp("helm-home"))
    docs = helm.template(kube_version="1.34.0")
    hooks = [
        w for d in docs if d["kind"].endswith("WebhookConfiguration") for w in d["webhooks"]
        if "matchConditions" in w and w["name"].endswith("-pods.gpu-admission.io")
    ]
    expressions = {c["expression"] for w in hooks for c in w["matchConditions"]}
    assert len(hooks) == 2 and len(expressions) == 1
    env = celpy.Environment()
    program = env.program(env.compile(expressions.pop()))

    def evaluate(pod: dict[str, Any]) -> bool:
        return bool(program.evaluate({"object": celpy.json_to_cel(pod)}))

    return evaluate


def pod(containers: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    annotations = spec.pop("annotations", None)
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": containers or [{"name": "app", "image": "busybox"}], **spec},
    }


def limits(**resources: str) -> dict[str, Any]:
    return {"name": "app", "image": "cuda", "resources": {"limits": resources}}


GPU_RESOURCES = [
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "cambricon.com/vmlu",
    "cambricon.com/mlu370.smlu.vmemory",
    "hygon.com/dcunum",
    "hygon.com/dcumem",
    "volcano.sh/vgpu-number",
    "volcano.sh/vgpu-memory",
    "nvidia.com/mig-3g.20gb",
    "example.com/gpu",
]


@pytest.mark.parametrize("name", GPU_RESOURCES)
def test_gpu_resources_in_limits_requests_and_init_containers_are_sent(may_use_gpu: Any, name: str) -> None:
    assert may_use_gpu(pod([limits(**{name: "1"})]))
    requests = {"name": "app", "image": "cuda", "resources": {"requests": {name: "1"}}}
    assert may_use_gpu(pod([requests]))
    assert may_use_gpu(pod(initContainers=[limits(**{name: "1"})]))


@pytest.mark.parametrize(
    "annotation",
    [
        "gpu-fraction",
        "gpu-memory",
        "gpu-admission.io/allocation",
        "hami.io/gpu-scheduler-policy",
        "nvidia.com/use-gputype",
    ],
)
def test_gpu_annotations_are_sent(may_use_gpu: Any, annotation: str) -> None:
    assert may_use_gpu(pod(annotations={annotation: "0.5"}))


@pytest.mark.parametrize(
    "variable",
    [
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "NVIDIA_DRIVER_CAPABILITIES",
    ],
)
def test_pods_choosing_their_own_gpus_without_a_request_are_sent(may_use_gpu: Any, variable: str) -> None:
    escape = {"name": "app", "image": "cuda", "env": [{"name": "A", "value": "1"}, {"name": variable, "value": "all"}]}
    assert may_use_gpu(pod([{"name": "side", "image": "busybox"}, escape]))
    assert may_use_gpu(pod(initContainers=[escape]))


def test_host_devices_runtime_class_and_claims_are_sent(may_use_gpu: Any) -> None:
    assert may_use_gpu(pod(volumes=[{"name": "d", "hostPath": {"path": "/dev/nvidia0"}}]))
    assert may_use_gpu(pod(volumes=[{"name": "e", "emptyDir": {}}, {"name": "d", "hostPath": {"path": "/"}}]))
    assert may_use_gpu(pod(runtimeClassName="nvidia-cdi"))
    assert may_use_gpu(pod(resourceClaims=[{"name": "gpu", "resourceClaimName": "one-gpu"}]))


def test_pods_that_cannot_use_a_gpu_are_skipped(may_use_gpu: Any) -> None:
    assert not may_use_gpu(pod())
    web = {
        "name": "web",
        "image": "nginx",
        "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}],
        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "100m"}},
    }
    assert not may_use_gpu(
        pod(
            [web],
            annotations={"prometheus.io/scrape": "true"},
            volumes=[{"name": "c", "configMap": {"name": "c"}}],
            runtimeClassName="gvisor",
        )
    )
    assert not may_use_gpu(
        pod(initContainers=[{"name": "init", "image": "busybox", "resources": {}}], resourceClaims=[])
    )


RESOURCE_NAMES = st.sampled_from(
    GPU_RESOURCES + ["cpu", "memory", "ephemeral-storage", "nvidia.com/priority", "hugepages-2Mi", "example.com/fpga"]
)
ENV_NAMES = st.sampled_from(
    [
        "PATH",
        "LD_PRELOAD",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_DEVICE_SM_LIMIT",
    ]
)
ANNOTATIONS = st.sampled_from(["gpu-fraction", "gpu-memory", "gpu-admission.io/placement", "app", "x.io/y"])
HOST_PATHS = st.sampled_from(["/dev", "/dev/nvidia0", "/dev/nvidiactl", "/var/log", "/run/nvidia"])
CONTAINERS = st.builds(
    lambda resources, env: {
        "name": "c",
        "image": "i",
        "resources": resources,
        **({"env": [{"name": n, "value": "1"} for n in env]} if env else {}),
    },
    st.fixed_dictionaries(
        {},
        optional={
            "limits": st.dictionaries(RESOURCE_NAMES, st.just("1"), max_size=3),
            "requests": st.dictionaries(RESOURCE_NAMES, st.just("1"), max_size=3),
        },
    ),
    st.lists(ENV_NAMES, max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(
    containers=st.lists(CONTAINERS, min_size=1, max_size=3),
    init=st.lists(CONTAINERS, max_size=2),
    annotations=st.dictionaries(ANNOTATIONS, st.just("1"), max_size=2),
    host_paths=st.lists(HOST_PATHS, max_size=2),
)
def test_every_gpu_pod_reaches_the_webhook(
    may_use_gpu: Any,
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]],
    annotations: dict[str, str],
    host_paths: list[str],
) -> None:
    spec: dict[str, Any] = {}
    if init:
        spec["initContainers"] = init
    if host_paths:
        spec["volumes"] = [{"name": f"h{i}", "hostPath": {"path": p}} for i, p in enumerate(host_paths)]
    candidate = pod(containers, annotations=annotations or None, **spec)
    if is_gpu_pod(candidate):
        assert may_use_gpu(candidate)
