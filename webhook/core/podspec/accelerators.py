"""Accelerators outside the vendor table (amd.com/gpu, gpu.intel.com/i915, habana.ai/gaudi, ...): not
GPUs of this controller, but the webhook answers a pod that asks for one, with a warning that nothing
counts or limits them, instead of waving it through silently. `looks_like_gpu` is memoised by the name."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

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


def _accelerator_names(pod: Mapping[str, Any]) -> Iterator[str]:
    for _, _, container in containers_of(mapping_of(pod.get("spec"))):
        resources = mapping_of(container.get("resources"))
        for key in ("limits", "requests"):
            for resource in mapping_of(resources.get(key)):
                if (isinstance(resource, str) and resource not in ("cpu", "memory") and looks_like_gpu(resource)
                        and classify_resource(resource) is None):
                    yield resource


def foreign_accelerators(pod: Mapping[str, Any]) -> list[str]:
    """The accelerators outside the vendor table a pod asks for, sorted."""
    return sorted(set(_accelerator_names(pod)))


def has_foreign_accelerator(pod: Mapping[str, Any]) -> bool:
    return next(_accelerator_names(pod), None) is not None
