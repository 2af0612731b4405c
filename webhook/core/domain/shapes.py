"""Request shapes and the histogram of them that the workload mix is learned from.

A shape is what placement needs to know of a GPU pod to weigh the fragmentation it causes: GPUs, the
share of a card each takes, host CPU and memory, the card models it allows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

MILLI = 1000
# (GPUs, thousandths of a card per GPU, CPU millicores, host memory MiB, lower-cased allowed models)
Shape = tuple[int, int, int, int, tuple[str, ...]]


def shape_of(gpus: int, milli: int | None, cpu_milli: int = 0, memory_mib: int = 0,
             models: Iterable[str] = ()) -> Shape | None:
    """A request shape; None for what takes no share of a card (no GPU, MIG devices, unknown share)."""
    if gpus <= 0 or milli is None or milli <= 0:
        return None
    return gpus, min(milli, MILLI), max(cpu_milli, 0), max(memory_mib, 0), tuple(sorted({m.lower() for m in models}))


def slice_milli(memory_mib: int | None, memory_pct: int | None, cores: int | None, card_mib: int = 0) -> int | None:
    """Thousandths of a card per GPU for a slice: its compute share (0 or 100 % and up: none), else its
    memory share, else the whole card. None when only MiB are known and the card is not."""
    if cores is not None and 0 < cores < 100:
        return cores * 10
    if memory_pct is not None and memory_pct < 100:
        return max(1, memory_pct * 10)
    if memory_mib is not None:
        return max(1, min(MILLI, -(-memory_mib * MILLI // card_mib))) if card_mib > 0 else None
    return MILLI


class Observed:
    """A published histogram of request shapes. Immutable by convention (shared by every snapshot until
    the histogram changes)."""

    __slots__ = ("counts",)

    def __init__(self, counts: Mapping[Shape, int]) -> None:
        self.counts = counts

    def plus(self, shapes: Iterable[Shape | None]) -> Observed:
        """This histogram with more pods counted (reservations, pods `check` has admitted)."""
        counts: dict[Shape, int] | None = None
        for shape in shapes:
            if shape is not None:
                counts = dict(self.counts) if counts is None else counts
                counts[shape] = counts.get(shape, 0) + 1
        return self if counts is None else Observed(counts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Observed) and self.counts == other.counts

    def __hash__(self) -> int:
        return hash(frozenset(self.counts.items()))

    def __repr__(self) -> str:
        return f"Observed({sum(self.counts.values())} pods, {len(self.counts)} shapes)"


EMPTY = Observed({})
