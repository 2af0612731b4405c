"""Small hand-built GPU nodes for the topology and placement tests.

- `dgx`: DGX H100, NVSwitch: 18 NVLink links between every pair; GPUs 0-3 on NUMA 0, 4-7 on NUMA 1.
- `paired`: 8 x A100 40 GB with NVLink bridges in pairs (0-1, 2-3, 4-5, 6-7), same NUMA split.
- `pcie_box`: 4 x T4, PCIe only, one NUMA node.
"""

from __future__ import annotations

from webhook.core.domain.model import Gpu, Node
from webhook.core.domain.request import PodRequest

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"
T4 = "Tesla-T4"


def pcie_matrix(numa: list[int], near: str = "NODE") -> tuple[tuple[str, ...], ...]:
    n = len(numa)
    return tuple(tuple("X" if i == j else (near if numa[i] == numa[j] else "SYS") for j in range(n)) for i in range(n))


def dgx(name: str = "dgx", unhealthy: tuple[int, ...] = (), cpu: int = 192_000, memory: int = 2_000_000) -> Node:
    numa = [0, 0, 0, 0, 1, 1, 1, 1]
    gpus = tuple(Gpu(i, f"GPU-{name}-{i}", H100, 81559, numa[i], i not in unhealthy) for i in range(8))
    links = tuple(tuple(0 if i == j else 18 for j in range(8)) for i in range(8))
    return Node(name, gpus, links, pcie_matrix(numa, "PXB"), cpu_milli=cpu, memory_mib=memory)


def paired(name: str = "paired", cpu: int = 96_000, memory: int = 1_000_000) -> Node:
    numa = [0, 0, 0, 0, 1, 1, 1, 1]
    gpus = tuple(Gpu(i, f"GPU-{name}-{i}", A100, 40960, numa[i]) for i in range(8))
    links = tuple(tuple(12 if i != j and i // 2 == j // 2 else 0 for j in range(8)) for i in range(8))
    return Node(name, gpus, links, pcie_matrix(numa), cpu_milli=cpu, memory_mib=memory)


def pcie_box(name: str = "t4", cpu: int = 32_000, memory: int = 128_000) -> Node:
    gpus = tuple(Gpu(i, f"GPU-{name}-{i}", T4, 15360, 0) for i in range(4))
    links = tuple(tuple(0 for _ in range(4)) for _ in range(4))
    return Node(name, gpus, links, pcie_matrix([0, 0, 0, 0], "PIX"), cpu_milli=cpu, memory_mib=memory)


def two_domains(name: str = "hgx16") -> Node:
    """16 GPUs in two NVSwitch domains (0-7 and 8-15) with no NVLink between them."""
    numa = [i // 8 for i in range(16)]
    gpus = tuple(Gpu(i, f"GPU-{name}-{i}", H100, 81559, numa[i]) for i in range(16))
    links = tuple(tuple(18 if i != j and i // 8 == j // 8 else 0 for j in range(16)) for i in range(16))
    return Node(name, gpus, links, pcie_matrix(numa), cpu_milli=256_000, memory_mib=2_000_000)


def request(gpus: int = 1, **kwargs: object) -> PodRequest:
    """A GPU pod request of the default vendor; keyword arguments as PodRequest's."""
    return PodRequest(namespace="team", name="pod", vendor="nvidia", gpus=gpus, is_gpu_pod=True, **kwargs)  # type: ignore[arg-type]
