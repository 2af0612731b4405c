"""What a card's free part is worth to the card-sharing shares likely to come: the waste table the
fragmentation measure reads (core/placement/fragmentation.py), and the per-card answers kept with it.

A mix's single-GPU shares under a whole card each come with a chance of filling a remainder they fit
(`fill_chances`); the table says, for each free part of a card, how much of it no share takes. Mixes of
the same shares and chances read one table (`waste_of`), so the answers computed with it are shared too.
"""

from __future__ import annotations

from array import array
from functools import lru_cache

MILLI = 1000  # one whole GPU

# A share that makes at least 1/COMMON of the card-sharing kinds' weight fills a remainder it fits; a
# rarer one does with a chance of RARE_FILL (`waste_table`). Two levels only, on purpose: the table and
# every state's values change when a share crosses the line, not with each new mix.
COMMON = 32
RARE_FILL = 0.25

# The shares single-GPU kinds take of a card, each with its chance of filling a remainder it fits.
Sizes = tuple[tuple[int, float], ...]
# One kind of task, compiled: (gpus, milli, normalised weight, cpu_milli, memory_mib, lower-cased models).
Kind = tuple[int, int, float, int, int, tuple[str, ...]]


def fill_chances(kinds: tuple[Kind, ...]) -> Sizes:
    """Each single-GPU share under a whole card, with its chance of filling a remainder (by share)."""
    weights: dict[int, float] = {}
    for gpus, milli, weight, *_ in kinds:
        if gpus == 1 and milli < MILLI:
            weights[milli] = weights.get(milli, 0.0) + weight
    total = sum(weights.values()) or 1.0
    return tuple(sorted((milli, 1.0 if COMMON * weight / total >= 1.0 else RARE_FILL)
                        for milli, weight in weights.items()))


@lru_cache(maxsize=64)
def waste_table(sizes: Sizes) -> array[float]:
    """For each free part of a card (0..MILLI thousandths), how much of it stays unused when tasks of the
    mix's card-sharing shares come to fill it: each share that fits comes with its chance (`sizes`,
    scaled down to sum to 1 where they pass it), and what none takes is lost. A card's remainder that a
    common share fills exactly wastes nothing; a 190 left beside an 810 task, where only rarer small
    shares fit, wastes most of itself. The chances have two levels, so the table (and every state's
    values) changes only when a share enters, leaves or crosses COMMON, not with each new mix."""
    table = array("d", [0.0]) * (MILLI + 1)
    fitting: list[tuple[int, float]] = []  # the shares that fit, with their chances as scaled
    taken = 0.0
    for free in range(MILLI + 1):
        if len(fitting) < len(sizes) and sizes[len(fitting)][0] <= free:
            while len(fitting) < len(sizes) and sizes[len(fitting)][0] <= free:
                fitting.append(sizes[len(fitting)])
            chances = [chance for _, chance in sizes[: len(fitting)]]
            taken = sum(chances)
            if taken > 1.0:
                chances = [chance / taken for chance in chances]
                taken = 1.0
            fitting = [(size, chance) for (size, _), chance in zip(fitting, chances, strict=True)]
        if not fitting:
            table[free] = float(free)
            continue
        table[free] = sum(c * table[free - size] for size, c in fitting) + (1.0 - taken) * free
    return table


@lru_cache(maxsize=256)
def changed_from(old: Sizes, new: Sizes) -> int:
    """The least free part of a card whose waste differs between the two sets of shares (MILLI + 1: none).
    A share entering, leaving or changing its chance changes the table from its size on only."""
    before, after = waste_table(old), waste_table(new)
    return next((free for free in range(MILLI + 1) if before[free] != after[free]), MILLI + 1)


def reach(free: tuple[int, ...]) -> int:
    """The highest entry of the waste table any kind's value reads for these free cards: a partial card's
    free part (or less), a whole card's remainder once filled with one share (under half a card)."""
    return max((f if f < MILLI else MILLI // 2 - 1 for f in free), default=-1)


class Waste:
    """A waste table (`waste_table`) for a set of shares, and the per-card-state answers computed with
    it: free-capacity vector -> (slots or 1, slots, stranded, left, the value when neither CPU nor memory
    holds a task back) per (GPUs, share), from the measure's `_cards`. Mixes of the same single-GPU
    shares hold one (`waste_of`), so a state tells by identity whether its values were computed against
    a mix's shares, and the answers are shared."""

    __slots__ = ("sizes", "table", "cards")

    def __init__(self, sizes: Sizes) -> None:
        self.sizes = sizes
        self.table = waste_table(sizes)
        self.cards: dict[tuple[int, ...], dict[tuple[int, int], tuple[int, int, float, float, float]]] = {}


@lru_cache(maxsize=64)
def waste_of(sizes: Sizes) -> Waste:
    """The one `Waste` of these shares while it is cached (a mix compiled from them keeps its own)."""
    return Waste(sizes)
