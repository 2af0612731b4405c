"""Pod spec -> PodRequest: vendor table, quantities, dialects, init containers, isolation rules."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.domain.refusal import Refusal
from webhook.core.domain.request import ContainerRequest, GpuRequest, TopologyPreference
from webhook.core.podspec.envvars import is_bypass_env, limit_env_of
from webhook.core.podspec.fastpath import is_gpu_pod
from webhook.core.podspec.quantity import (
    SUFFIXES,
    QuantityError,
    cpu_milli,
    format_quantity,
    memory_mib,
    parse_quantity,
    suffix_scale,
)
from webhook.core.podspec.resources import parse_pod
from webhook.core.podspec.vendor_table import classify_resource, vendor_of_resource


def pod(
    *containers: dict[str, Any],
    annotations: dict[str, str] | None = None,
    init: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init is not None:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def ctr(
    name: str = "main",
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    c: dict[str, Any] = {"name": name, "image": "img", "resources": resources, **extra}
    if env is not None:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return c


# --- quantities -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (1, Fraction(1)),
        ("1", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("2Gi", Fraction(2 * 2**30)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("1E", Fraction(10**18)),
        ("0.5", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("+3", Fraction(3)),
        ("-2k", Fraction(-2000)),
        (" 7 ", Fraction(7)),
        (0.25, Fraction(1, 4)),
        ("100n", Fraction(1, 10**7)),
    ],
)
def test_parse_quantity(text: object, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "'abc' is not a Kubernetes quantity"),
        ("", "'' is not a Kubernetes quantity"),
        ("1.2.3", "'1.2.3' is not a Kubernetes quantity"),
        ("1Gb", "'1Gb' is not a Kubernetes quantity"),
        (True, "True is a boolean, not a quantity"),
        (None, "expected a number or a quantity string, got NoneType"),
        ([1], "expected a number or a quantity string, got list"),
        ("1e999999", "'1e999999' is out of range"),
        ("9" * 50, f"{('9' * 50)[:40]!r} has too many digits"),
        (float("nan"), "nan is not a finite number"),
    ],
)
def test_parse_quantity_refuses_garbage(value: object, message: str) -> None:
    with pytest.raises(QuantityError) as err:
        parse_quantity(value)
    assert str(err.value) == message


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=-(10**15), max_value=10**15), st.sampled_from(SUFFIXES))
def test_quantity_round_trip(number: int, suffix: str) -> None:
    assert parse_quantity(format_quantity(number, suffix)) == number * suffix_scale(suffix)


@settings(max_examples=100, deadline=None)
@given(st.decimals(min_value=0, max_value=10**9, places=3, allow_nan=False, allow_infinity=False))
def test_decimal_strings_parse_exactly(value: Any) -> None:
    assert parse_quantity(str(value)) == Fraction(value)


def test_cpu_and_memory_round_up() -> None:
    assert cpu_milli("250m") == 250
    assert cpu_milli("1.5") == 1500
    assert cpu_milli("1n") == 1
    assert memory_mib("1Gi") == 1024
    assert memory_mib("1000000") == 1
    assert memory_mib("1M") == 1


# --- the vendor table -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("nvidia.com/gpu", ("nvidia", "count", 1)),
        ("nvidia.com/gpumem", ("nvidia", "memory", 1)),
        ("nvidia.com/gpumem-percentage", ("nvidia", "memory_pct", 1)),
        ("nvidia.com/gpucores", ("nvidia", "cores", 1)),
        ("volcano.sh/vgpu-number", ("nvidia", "count", 1)),
        ("volcano.sh/vgpu-memory", ("nvidia", "memory", 1)),
        ("volcano.sh/vgpu-cores", ("nvidia", "cores", 1)),
        ("cambricon.com/vmlu", ("cambricon", "count", 1)),
        ("cambricon.com/mlu.smlu.vmemory", ("cambricon", "memory", 256)),
        ("cambricon.com/mlu370.smlu.vcore", ("cambricon", "cores", 1)),
        ("cambricon.com/mlu590.smlu.vmemory", ("cambricon", "memory", 256)),
        ("hygon.com/dcunum", ("hygon", "count", 1)),
        ("hygon.com/dcumem", ("hygon", "memory", 1)),
        ("hygon.com/dcucores", ("hygon", "cores", 1)),
        ("nvidia.com/mig-3g.20gb", ("nvidia", "mig", 1)),
        ("example.com/gpu", None),
        ("nvidia.com/priority", None),
        ("cpu", None),
    ],
)
def test_classify_resource(name: str, expected: tuple[str, str, int] | None) -> None:
    assert classify_resource(name) == expected


def test_vendor_of_resource() -> None:
    assert vendor_of_resource("nvidia.com/mig-1g.10gb") == "nvidia"
    assert vendor_of_resource("hygon.com/dcumem") == "hygon"
    assert vendor_of_resource("amd.com/gpu") is None


# --- requests ---------------------------------------------------------------------------------


def test_hami_default_request() -> None:
    request = parse_pod(pod(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30})))
    assert request.containers == (
        ContainerRequest(
            "main",
            0,
            False,
            GpuRequest("nvidia", 1, 3000, None, 30),
            0,
            0,
            ("nvidia.com/gpumem", "nvidia.com/gpucores"),
        ),
    )
    assert (request.vendor, request.gpus, request.memory_mib, request.memory_pct, request.cores) == (
        "nvidia",
        1,
        3000,
        None,
        30,
    )
    assert request.is_gpu_pod and request.violations == () and request.shared


def test_memory_alone_implies_one_gpu() -> None:
    request = parse_pod(pod(ctr(limits={"nvidia.com/gpumem": "4096"})))
    assert request.containers[0].gpu == GpuRequest("nvidia", 1, 4096, None, None)
    assert request.gpus == 1


def test_requests_used_when_limits_absent_and_limits_win() -> None:
    only_requests = parse_pod(pod(ctr(requests={"nvidia.com/gpu": 2, "cpu": "1", "memory": "1Gi"})))
    assert only_requests.gpus == 2
    both = parse_pod(pod(ctr(limits={"nvidia.com/gpu": 3, "cpu": "4"}, requests={"nvidia.com/gpu": 2, "cpu": "2"})))
    assert both.gpus == 3
    assert both.cpu_milli == 2000  # host CPU: requests, as the scheduler counts it


def test_init_containers_count_as_kubernetes_does() -> None:
    request = parse_pod(
        pod(
            ctr("a", limits={"nvidia.com/gpu": 1}, requests={"cpu": "1", "memory": "1Gi"}),
            ctr("b", limits={"nvidia.com/gpu": 2}, requests={"cpu": "1", "memory": "1Gi"}),
            init=[ctr("warmup", limits={"nvidia.com/gpu": 4}, requests={"cpu": "500m", "memory": "4Gi"})],
        )
    )
    assert (request.gpus, request.cpu_milli, request.memory_mib_host) == (4, 2000, 4096)
    assert [(c.name, c.init, c.index) for c in request.containers] == [
        ("a", False, 0),
        ("b", False, 1),
        ("warmup", True, 0),
    ]
    smaller_init = parse_pod(pod(ctr("a", limits={"nvidia.com/gpu": 2}), init=[ctr("i", limits={"nvidia.com/gpu": 1})]))
    assert smaller_init.gpus == 2


def test_sidecar_init_containers_add_to_app_containers() -> None:
    request = parse_pod(
        pod(
            ctr("app", requests={"cpu": "1"}),
            init=[
                ctr("proxy", requests={"cpu": "250m"}, restartPolicy="Always"),
                ctr("setup", requests={"cpu": "2"}),
            ],
        )
    )
    assert request.cpu_milli == 2250  # max(1 + 0.25, 0.25 + 2)


def test_pod_overhead_counts() -> None:
    request = parse_pod(pod(ctr(requests={"cpu": "1", "memory": "1Gi"}), overhead={"cpu": "250m", "memory": "120Mi"}))
    assert (request.cpu_milli, request.memory_mib_host) == (1250, 1144)


def test_pod_level_demand_is_the_largest_per_gpu_ask() -> None:
    request = parse_pod(
        pod(
            ctr("a", limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000, "nvidia.com/gpucores": 20}),
            ctr("b", limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 5000, "nvidia.com/gpucores": 10}),
        )
    )
    assert (request.gpus, request.memory_mib, request.cores) == (2, 5000, 20)
    whole = parse_pod(
        pod(
            ctr("a", limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}),
            ctr("b", limits={"nvidia.com/gpu": 1}),
        )
    )
    assert (whole.gpus, whole.memory_mib, whole.cores) == (2, None, None)  # b holds whole cards


def test_cambricon_and_hygon() -> None:
    mlu = parse_pod(
        pod(
            ctr(
                limits={
                    "cambricon.com/vmlu": "1",
                    "cambricon.com/mlu370.smlu.vmemory": "20",
                    "cambricon.com/mlu370.smlu.vcore": "10",
                }
            )
        )
    )
    assert (mlu.vendor, mlu.gpus, mlu.memory_mib, mlu.cores) == ("cambricon", 1, 5120, 10)
    assert mlu.containers[0].moved_resources == (
        "cambricon.com/mlu370.smlu.vmemory",
        "cambricon.com/mlu370.smlu.vcore",
    )
    dcu = parse_pod(
        pod(ctr(limits={"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000, "hygon.com/dcucores": 60})),
    )
    assert (dcu.vendor, dcu.gpus, dcu.memory_mib, dcu.cores) == ("hygon", 1, 2000, 60)


def test_unknown_resources() -> None:
    # NVIDIA's plugin advertises replicas under a name of their own: devices of that resource, no warning.
    shared = parse_pod(pod(ctr(limits={"nvidia.com/gpu.shared": 1})))
    assert (shared.vendor, shared.gpus, shared.is_gpu_pod, shared.mig) == ("nvidia", 1, True, "nvidia.com/gpu.shared")
    assert shared.warnings == ()
    dcu = parse_pod(pod(ctr(limits={"hygon.com/dcu-k100": 1})))
    assert (dcu.vendor, dcu.gpus, dcu.mig) == ("hygon", 1, "")
    assert dcu.warnings == (
        "container 'main': hygon.com/dcu-k100 is not in the vendor table; counted as whole hygon devices",
    )
    other = parse_pod(pod(ctr(limits={"example.com/gpu": "1"})))
    assert (other.vendor, other.gpus, other.is_gpu_pod) == ("", 0, False)
    assert other.warnings == (
        "container 'main': example.com/gpu is not counted or limited by this controller; left alone",
    )


# --- malformed values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "rule", "message"),
    [
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150},
            "invalid-cores",
            "container 'main': nvidia.com/gpucores is 150, outside 0..100; write a whole percentage 0..100 "
            "(0: no compute cap)",
        ),
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 101},
            "invalid-quantity",
            "container 'main': nvidia.com/gpumem-percentage is 101, outside 1..100; write a whole percentage 1..100",
        ),
        (
            {"nvidia.com/gpu": "lots"},
            "invalid-quantity",
            "container 'main': nvidia.com/gpu: 'lots' is not a Kubernetes quantity; "
            "write a whole number of devices, e.g. 1",
        ),
        (
            {"nvidia.com/gpu": "500m"},
            "invalid-quantity",
            "container 'main': nvidia.com/gpu is 500m; write a whole number of devices, e.g. 1",
        ),
        (
            {"nvidia.com/gpu": 5000},
            "invalid-quantity",
            "container 'main': nvidia.com/gpu is 5000 devices; write a count up to 1024",
        ),
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "2Gi"},
            "invalid-quantity",
            "container 'main': nvidia.com/gpumem is 2Gi, 2147483648 MiB per GPU, which no GPU has; "
            "write a whole number of MiB, e.g. 3000",
        ),
        (
            {"nvidia.com/gpu": 1, "hygon.com/dcunum": 1},
            "mixed-vendors",
            "container 'main' asks for nvidia and hygon devices; use one vendor per pod",
        ),
        (
            {"nvidia.com/gpu": 1, "volcano.sh/vgpu-number": 1},
            "duplicate-resource",
            "container 'main' gives the GPU count twice (nvidia.com/gpu and volcano.sh/vgpu-number); keep one",
        ),
        (
            {"nvidia.com/gpu": 0, "nvidia.com/gpumem": 1000},
            "invalid-quantity",
            "container 'main' sets nvidia.com/gpu to 0 together with GPU memory or cores; "
            "ask for at least 1 GPU or remove them",
        ),
        (
            {"cpu": "fast"},
            "invalid-quantity",
            "container 'main': cpu: 'fast' is not a Kubernetes quantity; write e.g. 500m",
        ),
    ],
)
def test_malformed_values_are_422(limits: dict[str, Any], rule: str, message: str) -> None:
    request = parse_pod(pod(ctr(limits=limits)))
    assert request.violations == (Refusal(rule, 422, message),)


def test_vendors_mixed_across_containers() -> None:
    request = parse_pod(pod(ctr("a", limits={"nvidia.com/gpu": 1}), ctr("b", limits={"hygon.com/dcunum": 1})))
    assert request.violations == (
        Refusal("mixed-vendors", 422, "the pod asks for hygon and nvidia devices; use one vendor per pod"),
    )
    assert request.vendor == ""


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "metadata",
                        "spec",
                        "containers",
                        "resources",
                        "limits",
                        "env",
                        "name",
                        "nvidia.com/gpu",
                        "annotations",
                        "initContainers",
                        "volumes",
                        "hostPath",
                        "path",
                    ]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=20,
    )
)
def test_parse_pod_never_raises(data: Any) -> None:
    request = parse_pod(data)
    assert request.is_gpu_pod == (isinstance(data, dict) and is_gpu_pod(data))


def test_not_a_pod() -> None:
    request = parse_pod({"metadata": {"name": "x"}, "spec": {"containers": "oops"}})
    assert request.violations == (Refusal("invalid-pod", 422, "spec.containers: a pod needs at least one container"),)


# --- annotations ------------------------------------------------------------------------------


def test_selection_and_placement_annotations() -> None:
    request = parse_pod(
        pod(
            ctr(limits={"nvidia.com/gpu": 2}),
            annotations={
                "nvidia.com/use-gputype": "A100, V100,",
                "nvidia.com/nouse-gputype": "1080,2080",
                "nvidia.com/use-gpuuuid": "GPU-a,GPU-b",
                "nvidia.com/nouse-gpuuuid": "GPU-c",
                "gpu-admission.io/placement": "Fragmentation",
                "gpu-admission.io/topology": "required",
                "hami.io/gpu-scheduler-policy": "spread",
            },
        )
    )
    assert request.models_include == ("A100", "V100")
    assert request.models_exclude == ("1080", "2080")
    assert (request.uuids_include, request.uuids_exclude) == (("GPU-a", "GPU-b"), ("GPU-c",))
    assert (request.placement, request.gpu_placement) == ("fragmentation", "spread")
    assert request.topology is TopologyPreference.REQUIRED
    assert request.violations == ()


def test_hami_policies() -> None:
    request = parse_pod(
        pod(
            ctr(limits={"nvidia.com/gpu": 1}),
            annotations={
                "hami.io/node-scheduler-policy": "spread",
                "hami.io/gpu-scheduler-policy": "topology-aware",
            },
        )
    )
    # topology-aware is HAMi's filter for the best-linked GPU set: our topology preference.
    assert (request.placement, request.gpu_placement, request.topology) == ("spread", None, "preferred")
    assert request.warnings == ()
    ours_first = parse_pod(
        pod(
            ctr(limits={"nvidia.com/gpu": 1}),
            annotations={"hami.io/node-scheduler-policy": "spread", "gpu-admission.io/placement": "binpack"},
        )
    )
    assert ours_first.placement == "binpack"


def test_hygon_type_annotation() -> None:
    request = parse_pod(pod(ctr(limits={"hygon.com/dcunum": 1}), annotations={"hygon.com/use-dcutype": "DCU-K100_AI"}))
    assert request.models_include == ("DCU-K100_AI",)


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"gpu-admission.io/placement": "fastest"},
            "annotation gpu-admission.io/placement is 'fastest'; use one of best-fit, binpack, dot-product, "
            "fewest-tasks, fragmentation, random, spread",
        ),
        (
            {"gpu-admission.io/topology": "always"},
            "annotation gpu-admission.io/topology is 'always'; use one of none, preferred, required",
        ),
    ],
)
def test_bad_own_annotations_are_422(annotations: dict[str, str], message: str) -> None:
    request = parse_pod(pod(ctr(limits={"nvidia.com/gpu": 1}), annotations=annotations))
    assert request.violations == (Refusal("invalid-annotation", 422, message),)


def test_kai_annotations() -> None:
    fraction = parse_pod(pod(ctr(), annotations={"gpu-fraction": "0.5"}, schedulerName="kai-scheduler"))
    # KAI's fraction is a share of the card's memory, with no compute cap.
    assert fraction.containers[0].gpu == GpuRequest("nvidia", 1, None, 50, None)
    assert (fraction.gpus, fraction.memory_pct, fraction.cores, fraction.is_gpu_pod) == (1, 50, None, True)
    assert fraction.scheduler_name == "kai-scheduler"
    memory = parse_pod(pod(ctr(), annotations={"gpu-memory": "2000"}))
    assert memory.containers[0].gpu == GpuRequest("nvidia", 1, 2000, None, None)
    several = parse_pod(pod(ctr(), annotations={"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"}))
    assert several.gpus == 2


@pytest.mark.parametrize(
    ("annotations", "limits", "rule", "message"),
    [
        (
            {"gpu-fraction": "1.5"},
            None,
            "invalid-annotation",
            "annotation gpu-fraction is '1.5'; write a fraction of one GPU in (0, 1], e.g. \"0.5\"",
        ),
        (
            {"gpu-fraction": "0.5", "gpu-memory": "100"},
            None,
            "invalid-annotation",
            "annotations gpu-fraction and gpu-memory are both set; keep one",
        ),
        (
            {"gpu-memory": "lots"},
            None,
            "invalid-annotation",
            "annotation gpu-memory is 'lots'; write a whole number of MiB such as \"2000\"",
        ),
        (
            {"gpu-fraction": "0.5"},
            {"nvidia.com/gpu": 2},  # a count of 1 is the mutation's own output for the default scheduler
            "dialect-conflict",
            "the pod asks for GPUs in resources and in the gpu-fraction/gpu-memory annotations; use one of them",
        ),
    ],
)
def test_bad_kai_annotations(
    annotations: dict[str, str], limits: dict[str, Any] | None, rule: str, message: str
) -> None:
    request = parse_pod(pod(ctr(limits=limits), annotations=annotations))
    assert request.violations == (Refusal(rule, 422, message),)


def test_identity_fields() -> None:
    request = parse_pod(
        {
            "metadata": {"generateName": "job-", "uid": "u1"},
            "spec": {"nodeName": "n1", "containers": [ctr(limits={"nvidia.com/gpu": 1})]},
        }
    )
    assert (request.name, request.uid, request.namespace, request.node_name, request.scheduler_name) == (
        "job-",
        "u1",
        "default",
        "n1",
        "default-scheduler",
    )
    assert parse_pod(pod(ctr()), namespace="ns2").namespace == "ns2"
    assert parse_pod(pod(ctr())).namespace == "team-a"


# --- isolation --------------------------------------------------------------------------------

ENV_MESSAGE = (
    "container 'main' sets {} itself, which bypasses GPU isolation; remove it and ask for GPUs in "
    "resources.limits (e.g. nvidia.com/gpu: 1)"
)


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PIPE_DIRECTORY",
    ],
)
def test_bypass_variables_make_a_gpu_pod_and_are_403(name: str) -> None:
    request = parse_pod(pod(ctr(env={name: "all"})))
    assert request.is_gpu_pod
    assert request.violations == (Refusal("isolation-env", 403, ENV_MESSAGE.format(name)),)


@pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_DEVICE_MAX_CONNECTIONS", "PATH"])
def test_harmless_variables(name: str) -> None:
    assert not is_bypass_env(name)
    request = parse_pod(pod(ctr(env={name: "0"})))
    assert (request.is_gpu_pod, request.violations) == (False, ())


def test_ld_preload_and_privileged_only_matter_in_gpu_pods() -> None:
    plain = parse_pod(pod(ctr(env={"LD_PRELOAD": "/x.so"}, securityContext={"privileged": True})))
    assert (plain.is_gpu_pod, plain.violations) == (False, ())
    gpu = parse_pod(
        pod(
            ctr(
                limits={"nvidia.com/gpu": 1},
                env={"LD_PRELOAD": "/x.so"},
                securityContext={"privileged": True},
            )
        )
    )
    assert gpu.violations == (
        Refusal(
            "isolation-env",
            403,
            "container 'main' sets LD_PRELOAD, which can unload the GPU limit library; remove it from a GPU pod",
        ),
        Refusal(
            "isolation-privileged",
            403,
            "container 'main' is privileged, which exposes every GPU of the node; "
            "set securityContext.privileged: false",
        ),
    )


@pytest.mark.parametrize(
    ("path", "denied"),
    [
        ("/dev/nvidia0", True),
        ("/dev/nvidiactl", True),
        ("/dev", True),
        ("/dev/", True),
        ("/tmp/nvidia-mps", False),
        ("/dev/shm", False),
    ],
)
def test_device_host_paths(path: str, denied: bool) -> None:
    request = parse_pod(pod(ctr(), volumes=[{"name": "d", "hostPath": {"path": path}}]))
    assert request.is_gpu_pod is denied
    expected = (
        Refusal(
            "isolation-hostpath",
            403,
            f"volume hostPath {path} exposes the node's GPU devices; remove it and ask for GPUs in resources.limits",
        ),
    )
    assert request.violations == (expected if denied else ())


def test_our_own_limit_variables_are_not_a_bypass() -> None:
    env = {
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "NVIDIA_VISIBLE_DEVICES": "all",
    }
    container = ctr(limits={"nvidia.com/gpu": 1}, env=env)
    assert limit_env_of(container) == {"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_SM_LIMIT": "30"}
    mutated = parse_pod(pod(container, annotations={"gpu-admission.io/allocation": "{}"}))
    assert mutated.violations == (Refusal("isolation-env", 403, ENV_MESSAGE.format("NVIDIA_VISIBLE_DEVICES")),)
    unmutated = parse_pod(pod(container))
    assert [v.message for v in unmutated.violations] == [ENV_MESSAGE.format(n) for n in env]


def test_value_from_is_not_exempt() -> None:
    container = ctr(limits={"nvidia.com/gpu": 1})
    container["env"] = [{"name": "CUDA_DEVICE_SM_LIMIT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]
    assert limit_env_of(container) == {}
    request = parse_pod(pod(container, annotations={"gpu-admission.io/allocation": "{}"}))
    assert request.violations == (Refusal("isolation-env", 403, ENV_MESSAGE.format("CUDA_DEVICE_SM_LIMIT")),)


def test_is_gpu_pod_fast_path() -> None:
    assert not is_gpu_pod(pod(ctr(requests={"cpu": "1"})))
    assert is_gpu_pod(pod(ctr(requests={"nvidia.com/gpu": 1})))
    assert is_gpu_pod(pod(ctr(), init=[ctr("i", limits={"hygon.com/dcunum": 1})]))
    assert is_gpu_pod(pod(ctr(), annotations={"gpu-fraction": "0.5"}))
    assert is_gpu_pod(pod(ctr(), annotations={"gpu-admission.io/allocation": "{}"}))
    assert not is_gpu_pod(pod(ctr(), annotations={"nvidia.com/use-gputype": "A100"}))
    assert not is_gpu_pod({})


def test_evolve_copies_with_changes_and_refuses_unknown_fields() -> None:
    request = parse_pod({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}, "team-a")
    changed = request.evolve(cores=30, memory_pct=None)
    assert (changed.cores, changed.name, changed.namespace) == (30, "p", "team-a")
    assert request.cores is None  # the original is untouched
    assert changed == dataclasses.replace(request, cores=30)
    with pytest.raises(TypeError, match="no field colour"):
        request.evolve(colour="red")


_RESOURCE_NAMES = ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/mig-1g.5gb", "amd.com/gpu", "cpu", "memory",
                   "example.com/foo", "example.com/gpu-ish", 7]
_ENV_NAMES = ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_DEVICE_MEMORY_LIMIT_0",
              "CUDA_DEVICE_SM_LIMIT", "LD_PRELOAD", "FOO", None, 3]
_ANNOTATIONS = ["gpu-fraction", "gpu-memory", "gpu-admission.io/allocation", "team", "nvidia.com/use-gputype"]
_HOST_PATHS = ["/dev/nvidia0", "/dev", "/dev/../dev/nvidiactl", "/data", "", None]


@st.composite
def _pods_for_gpu_test(draw: st.DrawFn) -> object:
    def container() -> object:
        if draw(st.integers(0, 9)) == 0:
            return draw(st.sampled_from([None, "junk", []]))
        resources = {
            section: {name: draw(st.sampled_from(["1", "0", "2Gi", "x"])) for name in draw(st.lists(
                st.sampled_from(_RESOURCE_NAMES), max_size=3))}
            for section in draw(st.lists(st.sampled_from(["limits", "requests"]), max_size=2, unique=True))
        }
        env = [{"name": name, "value": "1"} if draw(st.booleans()) else "junk"
               for name in draw(st.lists(st.sampled_from(_ENV_NAMES), max_size=3))]
        return {"name": "c", "resources": resources, "env": env}

    annotations = {key: draw(st.sampled_from(["0.5", "{}", "x"])) for key in draw(st.lists(
        st.sampled_from(_ANNOTATIONS), max_size=2))}
    spec: dict[str, object] = {"containers": [container() for _ in range(draw(st.integers(0, 2)))]}
    if draw(st.booleans()):
        spec["initContainers"] = [container() for _ in range(draw(st.integers(1, 2)))]
    if draw(st.booleans()):
        spec["volumes"] = [{"name": "v", "hostPath": {"path": path}} for path in draw(st.lists(
            st.sampled_from(_HOST_PATHS), max_size=2))]
    return {"metadata": {"name": "p", "annotations": annotations}, "spec": spec}


@settings(max_examples=400, deadline=None)
@given(_pods_for_gpu_test())
def test_the_parsed_gpu_pod_flag_is_is_gpu_pod(pod: Any) -> None:
    assert parse_pod(pod, "team-a").is_gpu_pod is is_gpu_pod(pod)
