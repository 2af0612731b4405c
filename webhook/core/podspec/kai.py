"""KAI-Scheduler's (and Run:ai's, the same) GPU share annotations: how much of a GPU, and which container.

`gpu-fraction` is a share of one card's memory, `gpu-memory` MiB of it, `gpu-fraction-num-devices` how
many such cards; `gpu-fraction-container-name` the container the share is for. Read as KAI's binder
reads them, as an NVIDIA request; what is wrong becomes a message that says what to write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, NamedTuple

from webhook.core.domain.request import GpuRequest

from .quantity import QuantityError, parse_quantity
from .vendor_table import MAX_GPU_MEMORY_MIB, MAX_GPUS

KAI_FRACTION = "gpu-fraction"
KAI_FRACTION_DEVICES = "gpu-fraction-num-devices"
KAI_MEMORY = "gpu-memory"
KAI_FRACTION_CONTAINER = "gpu-fraction-container-name"  # the container (init first, then app) the share is for


def _number(value: object) -> Fraction | None:
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


def kai_request(annotations: Mapping[str, Any]) -> tuple[GpuRequest | None, str | None]:
    """KAI-Scheduler's gpu-fraction / gpu-memory annotations as an NVIDIA request, or what is wrong."""
    fraction, memory = annotations.get(KAI_FRACTION), annotations.get(KAI_MEMORY)
    if fraction is None and memory is None:
        return None, None
    if fraction is not None and memory is not None:
        return None, f"annotations {KAI_FRACTION} and {KAI_MEMORY} are both set; keep one"
    count = 1
    devices = annotations.get(KAI_FRACTION_DEVICES)
    if devices is not None:
        parsed = _number(devices)
        if parsed is None or parsed.denominator != 1 or not 1 <= parsed <= MAX_GPUS:
            return None, f"annotation {KAI_FRACTION_DEVICES} is {devices!r}; write a whole number of GPUs such as 2"
        count = int(parsed)
    if fraction is not None:
        share = _number(fraction)
        if share is None or not 0 < share <= 1:
            return None, f'annotation {KAI_FRACTION} is {fraction!r}; write a fraction of one GPU in (0, 1], e.g. "0.5"'
        # KAI's fraction is a share of the card's memory; KAI caps no compute (the pods time-slice).
        pct = max(1, round(share * 100))
        return GpuRequest("nvidia", count, None, pct, None), None
    mib = _number(memory)
    if mib is None or mib.denominator != 1 or not 1 <= mib <= MAX_GPU_MEMORY_MIB:
        return None, f'annotation {KAI_MEMORY} is {memory!r}; write a whole number of MiB such as "2000"'
    return GpuRequest("nvidia", count, int(mib), None, None), None


# Argo's workflow controller puts this annotation on every pod it creates (workflowpod.go), and makes
# the pod's first container its executor, ahead of the step's `main`: `wait`, or `supervisor` in the
# opt-in init-less pod layout.
ARGO_NODE_NAME = "workflows.argoproj.io/node-name"
ARGO_EXECUTORS, ARGO_MAIN = ("wait", "supervisor"), "main"


class FractionTarget(NamedTuple):
    """The container a share asked by annotation belongs to: its position in the pod's containers as
    listed (app containers, then init containers), or None with the refusal to give."""

    position: int | None
    problem: str | None


def fraction_container(containers: Sequence[tuple[str, bool]], annotations: Mapping[str, Any]) -> FractionTarget:
    """Which container gets a `gpu-fraction` / `gpu-memory` share, as KAI-Scheduler's binder decides it
    (GetFractionContainerRef in pkg/binder/common/gpu_access.go; Run:ai's annotations are the same):
    the container `gpu-fraction-container-name` names, init containers looked at first, else
    `spec.containers[0]`. `containers` is (name, init) in the order above.

    An Argo pod's first container is Argo's executor (`wait`), so without the name the share would go
    to it and the step (`main`) would run without a GPU: refused, naming the annotation that fixes it."""
    name = annotations.get(KAI_FRACTION_CONTAINER)
    if name is None:
        first = next((i for i, (_, init) in enumerate(containers) if not init), None)
        if first is not None and ARGO_NODE_NAME in annotations and containers[first][0] in ARGO_EXECUTORS:
            return FractionTarget(None, (
                f"annotations {KAI_FRACTION}/{KAI_MEMORY} give the share to the pod's first container, which "
                f"Argo makes its {containers[first][0]!r} executor, so the step ({ARGO_MAIN!r}) would get no GPU; "
                f"add {KAI_FRACTION_CONTAINER}: {ARGO_MAIN} to the template's metadata.annotations"))
        return FractionTarget(first, None)
    for want_init in (True, False):
        for i, (have, init) in enumerate(containers):
            if init == want_init and have == name:
                return FractionTarget(i, None)
    return FractionTarget(None, (f"annotation {KAI_FRACTION_CONTAINER} is {name!r}, which names no container of "
                                 "the pod; write the name of the container that uses the GPU"))
