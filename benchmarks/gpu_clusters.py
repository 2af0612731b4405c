"""Synthetic GPU nodes and clusters shared by the placement benchmarks.

Node kinds: NVSwitch 8-GPU H100 (18 links between every pair), 8-GPU A100 with NVLink bridges in pairs
(0-1, 2-3, ...), PCIe-only 4-GPU L4 and 8-GPU A10 boxes. Two NUMA nodes on the 8-GPU kinds.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from webhook.core.domain.model import Gpu, GpuUsage, Node, NodeUsage


def _pcie(numa: list[int], near: str = "NODE") -> tuple[tuple[str, ...], ...]:
    n = len(numa)
    return tuple(tuple("X" if i == j else (near if numa[i] == numa[j] else "SYS") for j in range(n)) for i in range(n))


def _node(name: str, model: str, memory: int, nvlink: Callable[[int, int], int], count: int, near: str,
          cpu: int, host_memory: int) -> Node:  # fmt: skip
    numa = [0 if i < count // 2 or count < 8 else 1 for i in range(count)]
    gpus = tuple(Gpu(i, f"GPU-{name}-{i}", model, memory, numa[i]) for i in range(count))
    links = tuple(tuple(0 if i == j else nvlink(i, j) for j in range(count)) for i in range(count))
    return Node(name, gpus, links, _pcie(numa, near), cpu_milli=cpu, memory_mib=host_memory,
                inventory_source="inventory")  # fmt: skip


def nvswitch_node(name: str) -> Node:
    return _node(name, "NVIDIA-H100-80GB-HBM3", 81559, lambda i, j: 18, 8, "PXB", 192_000, 2_000_000)


def paired_node(name: str) -> Node:
    return _node(name, "NVIDIA-A100-SXM4-40GB", 40960, lambda i, j: 12 if i // 2 == j // 2 else 0, 8, "NODE",
                 96_000, 1_000_000)  # fmt: skip


def pcie_node(name: str, count: int = 4) -> Node:
    model, memory = ("NVIDIA-L4", 23034) if count == 4 else ("NVIDIA-A10", 23028)
    return _node(name, model, memory, lambda i, j: 0, count, "PHB", 64_000, 256_000)


KINDS: dict[str, Callable[[str], Node]] = {
    "nvswitch": nvswitch_node,
    "paired": paired_node,
    "pcie4": pcie_node,
    "pcie8": lambda name: pcie_node(name, 8),
}


def mixed_cluster(gpus: int, shares: dict[str, float] | None = None) -> dict[str, Node]:
    """About `gpus` GPUs split between node kinds by GPU share (default: 35/35/15/15)."""
    shares = shares or {"nvswitch": 0.35, "paired": 0.35, "pcie4": 0.15, "pcie8": 0.15}
    nodes: dict[str, Node] = {}
    for kind, share in shares.items():
        per_node = len(KINDS[kind]("x").gpus)
        for i in range(max(1, round(gpus * share / per_node))):
            node = KINDS[kind](f"{kind}-{i:05d}")
            nodes[node.name] = node
    return nodes


# Pod shapes of the background load: (GPUs, thousandths of a GPU, CPU millicores, host memory MiB).
BACKGROUND = [(1, 1000, 8000, 65536), (1, 500, 4000, 32768), (1, 250, 2000, 16384), (2, 1000, 16000, 131072),
              (4, 1000, 32000, 262144), (8, 1000, 64000, 524288)]  # fmt: skip


def busy_usage(nodes: dict[str, Node], fill: float, seed: int = 1) -> dict[str, NodeUsage]:
    """Usage with about `fill` of the GPU capacity taken by pods of the BACKGROUND shapes.

    Each node independently gets whole-card pods on its first GPUs and shared slices on the next one,
    as a packing scheduler leaves them; CPU and memory grow with the pods.
    """
    rng = random.Random(seed)
    usage: dict[str, NodeUsage] = {}
    for name, node in sorted(nodes.items()):
        count = len(node.gpus)
        if rng.random() > fill * 1.25:
            continue
        gpus = [GpuUsage() for _ in range(count)]
        cpu = memory = tasks = 0
        taken = rng.randint(0, count)
        i = 0
        while i < taken:
            size = min(rng.choice([1, 1, 2, 4]), taken - i)
            for g in range(i, i + size):
                gpus[g] = GpuUsage(node.gpus[g].memory_mib, 100, 1, True)
            cpu += 8000 * size
            memory += 65536 * size
            tasks += 1
            i += size
        if taken < count and rng.random() < 0.5:
            milli = rng.choice([250, 500])
            slices = rng.randint(1, 1000 // milli)
            card = node.gpus[taken].memory_mib
            gpus[taken] = GpuUsage(card * milli // 1000 * slices, milli // 10 * slices, slices, False)
            cpu += 2000 * slices
            memory += 16384 * slices
            tasks += slices
        usage[name] = NodeUsage(tuple(gpus), cpu, memory, tasks)
    return usage
