"""The GPU link graph of a node: which free GPU set talks best, its topology class and expected loss.

A multi-GPU job is only as fast as its slowest link, so GPUs are chosen all-NVLink first (every pair
linked), then mixed, then PCIe-only; within a class more links, closer PCIe paths and fewer NUMA nodes
win, and among equals the choice that leaves the most NVLink pairs free for the next job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations
from math import comb

from webhook.core.domain.model import Node, TopologyClass

# `nvidia-smi topo -m` path levels, closest first. Unknown levels count as the farthest.
PCIE_RANK: Mapping[str, int] = {"X": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
FARTHEST = 5
CLASS_RANK: Mapping[TopologyClass, int] = {
    TopologyClass.SINGLE: 0,
    TopologyClass.NVLINK: 0,
    TopologyClass.MIXED: 1,
    TopologyClass.PCIE: 2,
}
# Above this many candidate sets a node is searched greedily instead of exhaustively.
EXHAUSTIVE_LIMIT = 3000
_MEMO_LIMIT = 1 << 14

Matrix = tuple[tuple[int, ...], ...]
PathMatrix = tuple[tuple[str, ...], ...]
_Key = tuple[int, int, int, int, int, int, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class GpuSet:
    """A chosen set of GPUs on one node and how well it is connected."""

    gpus: tuple[int, ...]
    topology: TopologyClass
    nvlink_pairs: int  # pairs linked by NVLink
    links: int  # NVLink links summed over the pairs
    pcie_cost: int  # PCIe path ranks summed over the pairs (PIX=1 ... SYS=5)
    numa_nodes: int  # distinct NUMA nodes spanned


def classify_pairs(size: int, nvlink_pairs: int) -> TopologyClass:
    """Topology class of a set of `size` GPUs of which `nvlink_pairs` pairs are NVLink-linked."""
    if size <= 1:
        return TopologyClass.SINGLE
    if nvlink_pairs == size * (size - 1) // 2:
        return TopologyClass.NVLINK
    return TopologyClass.PCIE if nvlink_pairs == 0 else TopologyClass.MIXED


def expected_loss(topology: TopologyClass, table: Mapping[TopologyClass, float]) -> float:
    """Expected communication loss of a class (0..1), from a configurable table."""
    return float(table.get(topology, 0.0))


def _bits(mask: int) -> tuple[int, ...]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return tuple(out)


def mask_of(gpus: tuple[int, ...] | list[int]) -> int:
    """Bitmask of GPU indices."""
    mask = 0
    for g in gpus:
        mask |= 1 << g
    return mask


@dataclass(frozen=True, eq=False)
class LinkGraph:
    """The link matrices of one node shape, precomputed for fast set search (shared by equal nodes)."""

    size: int
    links: Matrix
    ranks: Matrix  # PCIe path rank per pair
    numa: tuple[int, ...]
    adjacency: tuple[int, ...]  # NVLink neighbours of each GPU, as bitmasks
    _memo: dict[tuple[int, int, int], GpuSet | None] = field(default_factory=dict, repr=False)
    _cliques: dict[int, int] = field(default_factory=dict, repr=False)

    @staticmethod
    def of(nvlink: Matrix, pcie: PathMatrix, numa: tuple[int, ...]) -> LinkGraph:
        """The graph of these matrices (memoised: equal matrices share one graph and its caches)."""
        return _graph(nvlink, pcie, numa)

    @staticmethod
    def of_node(node: Node) -> LinkGraph:
        return _graph(node.nvlink, node.pcie, tuple(g.numa for g in node.gpus))

    def classify(self, gpus: tuple[int, ...]) -> TopologyClass:
        pairs = sum(1 for a, b in combinations(gpus, 2) if self.links[a][b] > 0)
        return classify_pairs(len(gpus), pairs)

    def describe(self, gpus: tuple[int, ...]) -> GpuSet:
        """Connectivity figures of an explicit set."""
        pairs = links = cost = 0
        for a, b in combinations(gpus, 2):
            n = self.links[a][b]
            if n > 0:
                pairs += 1
                links += n
            cost += self.ranks[a][b]
        numa = len({self.numa[g] for g in gpus})
        return GpuSet(tuple(sorted(gpus)), classify_pairs(len(gpus), pairs), pairs, links, cost, numa)

    def best_set(self, free: int, k: int, pool: int = 0) -> GpuSet | None:
        """The best-connected set of `k` GPUs among the bitmask `free`; None when too few are free.

        Among equally good sets, the one leaving the most NVLink pairs within `pool` (default `free`:
        the GPUs that stay available to others) wins.
        """
        pool = pool | free
        key = (free, k, pool)
        memo = self._memo
        if key in memo:
            return memo[key]
        result = self._search(free, k, pool)
        if len(memo) >= _MEMO_LIMIT:
            memo.clear()
        memo[key] = result
        return result

    def largest_clique(self, allowed: int) -> int:
        """Size of the largest set among `allowed` (bitmask) whose every pair is NVLink-linked."""
        memo = self._cliques
        if allowed not in memo:
            if len(memo) >= _MEMO_LIMIT:
                memo.clear()
            memo[allowed] = self._clique(0, allowed, 0) if allowed else 0
        return memo[allowed]

    def could_nvlink(self, allowed: int, k: int) -> bool:
        """Whether `k` GPUs among `allowed` could ever form an all-NVLink set (one GPU always can)."""
        if k <= 1:
            return bin(allowed).count("1") >= k
        return self.largest_clique(allowed) >= k

    # -- search ---------------------------------------------------------------------------------

    def _key(self, gpus: tuple[int, ...], pool: int) -> _Key:
        chosen = mask_of(gpus)
        figures = self.describe(gpus)
        rest = pool & ~chosen
        spare = sum((self.adjacency[g] & rest).bit_count() for g in _bits(rest)) // 2
        rank = CLASS_RANK[figures.topology]
        return (
            rank,
            -figures.nvlink_pairs,
            -figures.links,
            figures.pcie_cost,
            figures.numa_nodes,
            -spare,
            gpus,
        )

    def _search(self, free: int, k: int, pool: int) -> GpuSet | None:
        candidates = _bits(free)
        if k <= 0 or len(candidates) < k:
            return None
        if comb(len(candidates), k) <= EXHAUSTIVE_LIMIT:
            sets: list[tuple[int, ...]] = list(combinations(candidates, k))
        else:
            sets = [self._grow(seed, free, k) for seed in candidates]
        best = min(sets, key=lambda s: self._key(s, pool))
        return self.describe(best)

    def _grow(self, seed: int, free: int, k: int) -> tuple[int, ...]:
        """Greedy: add the GPU linked to the most chosen ones (then most links, closest path, same NUMA)."""
        chosen = [seed]
        mask = 1 << seed
        while len(chosen) < k:
            best: tuple[int, int, int, int, int] | None = None
            for g in _bits(free & ~mask):
                linked = (self.adjacency[g] & mask).bit_count()
                links = sum(self.links[g][c] for c in chosen)
                cost = sum(self.ranks[g][c] for c in chosen)
                far = 0 if self.numa[g] == self.numa[seed] else 1
                cand = (-linked, -links, cost, far, g)
                if best is None or cand < best:
                    best = cand
            assert best is not None
            chosen.append(best[4])
            mask |= 1 << best[4]
        return tuple(sorted(chosen))

    def _clique(self, chosen: int, candidates: int, size: int) -> int:
        """Bron-Kerbosch without pivoting on bitmasks: the graphs have at most a few dozen GPUs."""
        if not candidates:
            return size
        best = size
        while candidates:
            if size + candidates.bit_count() <= best:
                break
            low = candidates & -candidates
            g = low.bit_length() - 1
            candidates ^= low
            best = max(best, self._clique(chosen | low, candidates & self.adjacency[g], size + 1))
        return best


@lru_cache(maxsize=1024)
def _graph(nvlink: Matrix, pcie: PathMatrix, numa: tuple[int, ...]) -> LinkGraph:
    size = len(numa)

    def count(i: int, j: int) -> int:
        return nvlink[i][j] if i != j and i < len(nvlink) and j < len(nvlink[i]) else 0

    links = tuple(tuple(max(count(i, j), count(j, i)) for j in range(size)) for i in range(size))
    ranks = tuple(
        tuple(
            0 if i == j else PCIE_RANK.get(pcie[i][j] if i < len(pcie) and j < len(pcie[i]) else "", FARTHEST)
            for j in range(size)
        )
        for i in range(size)
    )
    adjacency = tuple(sum(1 << j for j in range(size) if links[i][j] > 0) for i in range(size))
    return LinkGraph(size, links, ranks, numa, adjacency)


def best_gpu_set(node: Node, free: tuple[int, ...], k: int) -> GpuSet | None:
    """The best-connected `k` GPUs of a node among the indices `free`."""
    return LinkGraph.of_node(node).best_set(mask_of(free), k)


def topology_of(node: Node, gpus: tuple[int, ...]) -> TopologyClass:
    """Topology class of an explicit GPU set of a node."""
    return LinkGraph.of_node(node).classify(gpus)


def largest_nvlink_clique(node: Node, healthy_only: bool = True) -> int:
    """The largest all-NVLink set the node has (its healthy GPUs by default)."""
    allowed = mask_of([i for i, g in enumerate(node.gpus) if g.healthy or not healthy_only])
    return LinkGraph.of_node(node).largest_clique(allowed)


def could_ever_nvlink(node: Node, k: int) -> bool:
    """Whether the node, empty, could give `k` healthy GPUs all linked by NVLink."""
    return largest_nvlink_clique(node) >= k if k > 1 else len([g for g in node.gpus if g.healthy]) >= k
