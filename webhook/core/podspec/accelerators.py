"""Accelerators outside the vendor table (amd.com/gpu, gpu.intel.com/i915, habana.ai/gaudi, ...): not
GPUs of this controller, but the webhook answers a pod that asks for one, with a warning that nothing
counts or limits them, instead of waving it through silently. `looks_like_gpu` is memoised by the name."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from functools import lru_cache
from typing import Any

from webhook.core.domain.podview import PodView

from .coerce import containers_of, mapping_of
from .vendor_table import classify_resource

_ACCELERATOR_WORDS = ("gpu", "mlu", "dcu", "npu", "tpu", "xpu", "gcu", "hpu", "fpga", "ascend", "neuron", "gaudi",
                      "accelerator")
# Domains whose every resource is an accelerator, though its name part says so in no word above: Intel's
# GPU plugin (`gpu.intel.com/i915`, `xe`, and GPU Aware Scheduling's `millicores`, `memory.max`), Habana's
# Gaudi plugin (`habana.ai/gaudi`, `goya`), Xilinx's FPGA plugin (`xilinx.com/fpga-<shell>`). A domain
# label that is an accelerator word counts too (`fpga.intel.com/af-<id>`, `npu.intel.com/accel`).
_ACCELERATOR_DOMAINS = frozenset({"habana.ai", "xilinx.com"})


@lru_cache(maxsize=1024)
def looks_like_gpu(name: str) -> bool:
    """An extended resource that names an accelerator this controller does not count (amd.com/gpu,
    gpu.intel.com/i915, habana.ai/gaudi, huawei.com/Ascend910, aws.amazon.com/neuroncore, google.com/tpu):
    by its domain, or by a word of the table above in its name part."""
    domain, slash, part = name.lower().rpartition("/")
    if not slash:
        return False
    if domain in _ACCELERATOR_DOMAINS or any(label in _ACCELERATOR_WORDS for label in domain.split(".")):
        return True
    return any(word in part for word in _ACCELERATOR_WORDS)


def foreign_accelerator_message(where: str, name: str) -> str:
    return f"{where}: {name} is not counted or limited by this controller; left alone"


def _foreign(names: Iterable[object]) -> Iterator[str]:
    for resource in names:
        if (isinstance(resource, str) and resource not in ("cpu", "memory") and looks_like_gpu(resource)
                and classify_resource(resource) is None):
            yield resource


def _raw_resource_names(pod: Mapping[str, Any]) -> Iterator[object]:
    for _, _, container in containers_of(mapping_of(pod.get("spec"))):
        resources = mapping_of(container.get("resources"))
        for key in ("limits", "requests"):
            yield from mapping_of(resources.get(key))


def foreign_accelerators(pod: PodView) -> list[str]:
    """The accelerators outside the vendor table a pod asks for, sorted."""
    containers = pod.of_kind("containers", "initContainers")
    return sorted(set(_foreign(name for c in containers for section in (c.limits, c.requests) for name in section)))


def has_foreign_accelerator(pod: Mapping[str, Any]) -> bool:
    """The fast path's test, on the pod as it came (see fastpath.py)."""
    return next(_foreign(_raw_resource_names(pod)), None) is not None
