"""The Alibaba GPU cluster trace (cluster-trace-gpu-v2023, "openb"): node and pod CSVs -> core values.

The trace gives GPU demand in thousandths of one card (`gpu_milli`, per requested GPU). The core asks for
a share of compute and a share of memory; a trace task gets the same share of both, as a percentage of
whichever card it lands on, so the card's size never matters to the outcome.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from webhook.core.domain.model import Gpu, Node
from webhook.core.domain.request import PodRequest
from webhook.errors import UserError

MILLI = 1000

# Card memory in MiB per trace model name. The trace does not give it, and G1/G2/G3 are undisclosed
# internal codes: these are the marketed sizes (16, 32, 24 GB) written as multiples of 1000 so that every
# whole-percent share is a whole number of MiB. Shares are proportional, so only the ratios would matter.
MODEL_MEMORY_MIB: dict[str, int] = {
    "P100": 16000,
    "T4": 16000,
    "V100M16": 16000,
    "V100M32": 32000,
    "A10": 24000,
    "G1": 32000,
    "G2": 32000,
    "G3": 32000,
}
UNKNOWN_MODEL_MEMORY_MIB = 32000

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
NAMESPACE = "trace"


@dataclass(frozen=True, slots=True)
class TracePod:
    """One task of the trace, in the trace's own units."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    milli: int  # thousandths of a card per GPU (1000: whole cards; 0: no GPU)
    models: tuple[str, ...] = ()  # allowed GPU models; empty: any

    @property
    def gpu_milli(self) -> int:
        """The task's whole GPU request, in thousandths of a card."""
        return self.gpus * self.milli


def _rows(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) for each data row; a missing file or column is a UserError naming it."""
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as err:
        raise UserError(f"{path}: cannot read: {err.strerror or err}") from None
    with handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise UserError(f"{path}:1: missing column {', '.join(missing)} (header: {','.join(header)})")
        try:
            for row in reader:
                if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
                    continue
                yield reader.line_num, row
        except (csv.Error, UnicodeDecodeError) as err:
            raise UserError(f"{path}:{reader.line_num}: not CSV: {err}") from None


def _integer(path: Path, line: int, row: dict[str, str], column: str, low: int, high: int | None = None) -> int:
    text = (row.get(column) or "").strip()
    try:
        value = int(text)
    except ValueError:
        try:
            as_float = float(text)
        except ValueError:
            as_float = float("nan")
        if not as_float.is_integer():
            raise UserError(f"{path}:{line}: column {column}: {text!r} is not a whole number") from None
        value = int(as_float)
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise UserError(f"{path}:{line}: column {column}: {value} is out of range ({bound})")
    return value


def load_nodes(path: str | Path) -> list[Node]:
    """GPU nodes from a node list CSV (sn, cpu_milli, memory_mib, gpu, model)."""
    file = Path(path)
    nodes: list[Node] = []
    seen: set[str] = set()
    for line, row in _rows(file, NODE_COLUMNS):
        name = (row.get("sn") or "").strip()
        if not name:
            raise UserError(f"{file}:{line}: column sn: empty node name")
        if name in seen:
            raise UserError(f"{file}:{line}: column sn: duplicate node {name}")
        seen.add(name)
        cpu = _integer(file, line, row, "cpu_milli", 0)
        memory = _integer(file, line, row, "memory_mib", 0)
        count = _integer(file, line, row, "gpu", 0, 64)
        model = (row.get("model") or "").strip()
        if count and not model:
            raise UserError(f"{file}:{line}: column model: empty for a node with {count} GPUs")
        nodes.append(make_node(name, cpu, memory, count, model))
    if not nodes:
        raise UserError(f"{file}: no nodes")
    return nodes


def make_node(name: str, cpu_milli: int, memory_mib: int, gpus: int, model: str) -> Node:
    """A node with `gpus` identical cards joined by PCIe (the trace says nothing of NVLink)."""
    card = MODEL_MEMORY_MIB.get(model, UNKNOWN_MODEL_MEMORY_MIB)
    devices = tuple(Gpu(index=i, uuid=f"{name}-gpu{i}", model=model, memory_mib=card) for i in range(gpus))
    return Node(
        name=name,
        gpus=devices,
        nvlink=tuple(tuple(0 for _ in range(gpus)) for _ in range(gpus)),
        pcie=tuple(tuple("X" if i == j else "NODE" for j in range(gpus)) for i in range(gpus)),
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        labels={"nvidia.com/gpu.product": model} if model else {},
        inventory_source="labels" if gpus else "none",
    )


def load_pods(path: str | Path) -> list[TracePod]:
    """Tasks from a pod list CSV (name, cpu_milli, memory_mib, num_gpu, gpu_milli[, gpu_spec])."""
    file = Path(path)
    pods: list[TracePod] = []
    for line, row in _rows(file, POD_COLUMNS):
        name = (row.get("name") or "").strip() or f"pod-line-{line}"
        cpu = _integer(file, line, row, "cpu_milli", 0)
        memory = _integer(file, line, row, "memory_mib", 0)
        gpus = _integer(file, line, row, "num_gpu", 0, 64)
        milli = _integer(file, line, row, "gpu_milli", 0, MILLI)
        if gpus and not milli:
            raise UserError(f"{file}:{line}: column gpu_milli: 0 for a task asking for {gpus} GPUs")
        if milli and not gpus:
            raise UserError(f"{file}:{line}: column num_gpu: 0 for a task asking for {milli} gpu_milli")
        spec = (row.get("gpu_spec") or "").strip()
        models = tuple(m.strip() for m in spec.split("|") if m.strip()) if spec else ()
        pods.append(TracePod(name, cpu, memory, gpus, milli, models))
    if not pods:
        raise UserError(f"{file}: no pods")
    return pods


def to_request(pod: TracePod) -> PodRequest:
    """The core's view of a trace task: a share of both compute and memory of each card, as percentages."""
    share = -(-pod.milli // 10) if 0 < pod.milli < MILLI else None  # whole percent, rounded up
    return PodRequest(
        namespace=NAMESPACE,
        name=pod.name,
        uid=pod.name,
        vendor="nvidia" if pod.gpus else "",
        gpus=pod.gpus,
        memory_pct=share,
        cores=share,
        cpu_milli=pod.cpu_milli,
        memory_mib_host=pod.memory_mib,
        models_include=pod.models,
        is_gpu_pod=pod.gpus > 0,
    )
