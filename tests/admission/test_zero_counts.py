"""A GPU resource named with a count of 0 is a pod that asks for no GPU: the rules for such pods apply.

The device plugin hands a `nvidia.com/gpu: 0` container no device, but a CUDA image's own
`ENV NVIDIA_VISIBLE_DEVICES=all` (or, on legacy images, `CUDA_VERSION`, which the toolkit reads as "all
GPUs" when the variable is unset) still reaches every GPU of the node it lands on. So the pod is judged on
what it can reach, like the same pod with no GPU resource at all."""

from __future__ import annotations

from typing import Any

import pytest
from isolation_support import SNAP, VOID, chain, cpu_pod

from webhook.core.admission import admit
from webhook.core.policy.model import Policy, parse_policy

TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
ZERO_COUNTS = [
    {"nvidia.com/gpu": "0"},
    {"nvidia.com/gpu": 0},
    {"nvidia.com/mig-1g.10gb": "0"},
    {"volcano.sh/vgpu-number": "0"},
]


def zero_pod(resources: dict[str, Any], where: str = "containers", **spec: Any) -> dict[str, Any]:
    container = {"name": "app", "image": "nvcr.io/nvidia/cuda:12.4.1-base", "resources": {"limits": resources}}
    p = cpu_pod(**spec)
    if where == "containers":
        p["spec"]["containers"] = [container]
    else:
        p["spec"]["initContainers"] = [{**container, "name": "init"}]
    return p


@pytest.mark.parametrize("resources", ZERO_COUNTS)
@pytest.mark.parametrize("where", ["containers", "initContainers"])
@pytest.mark.parametrize(
    "route", [{"tolerations": TOLERATE_GPU}, {"runtimeClassName": "nvidia"}, {"tolerations": [{"operator": "Exists"}]}]
)
def test_a_zero_count_that_can_reach_a_gpu_node_is_pinned_to_no_device(
    resources: dict[str, Any], where: str, route: dict[str, Any]
) -> None:
    p = zero_pod(resources, where, **route)
    decision, final, validated = chain(p)
    assert (decision.allowed, decision.reason, validated.allowed) == (True, "neutralised", True)
    for key in ("containers", "initContainers"):
        for container in final["spec"].get(key, ()):
            assert VOID in container["env"], (key, container)
    # Without the mutation (the mutating webhook skipped), validation refuses it.
    unmutated = admit.validate(p, SNAP, Policy())
    assert (unmutated.allowed, unmutated.reason) == (False, "gpu-reachable")
    # And a policy that refuses such pods refuses this spelling too.
    denied = admit.mutate(p, SNAP, parse_policy({"isolation": {"nonGpuAccess": "deny"}}))
    assert (denied.allowed, denied.reason) == (False, "gpu-reachable")


def test_a_zero_count_on_a_named_gpu_node_is_pinned_like_a_pod_without_gpu_resources() -> None:
    with_zero = chain(zero_pod({"nvidia.com/gpu": "0"}, nodeName="h1"))[0]
    without = chain(cpu_pod(nodeName="h1"))[0]
    assert (with_zero.reason, with_zero.patch) == (without.reason, without.patch) == ("neutralised", with_zero.patch)


def test_a_zero_count_that_cannot_reach_a_gpu_node_stays_unchanged() -> None:
    decision, final, validated = chain(zero_pod({"nvidia.com/gpu": "0"}, nodeSelector={"pool": "cpu"}))
    assert decision.allowed and validated.allowed
    assert decision.reason in ("no-gpu-requested", "not-gpu-pod") and decision.patch == ()
