"""The best options among the candidate classes: ranked by loss, score, preferred node affinity and
name, or drawn at random; only as many nodes are looked at as the answer holds."""

from __future__ import annotations

import random
from bisect import bisect_right

from webhook.core.domain.model import Option

from .context import PlacementContext
from .nodereach import ShapeReach
from .scoring import Candidate, option_of


def best_options(cands: list[Candidate], topology_first: bool, ctx: PlacementContext,
                  preferences: ShapeReach | None) -> list[Option]:
    """The `limit` best nodes: by loss (multi-GPU), then score, then (with `preferences`) the summed
    weight of the preferred terms a node meets, then node name. Only the tied groups that reach the
    result are split by weight."""
    limit = ctx.limit
    ranked = []
    for k, c in enumerate(cands):
        ranked.append((c.loss if topology_first else 0.0, -c.score, c.names[0], k))
    if limit == 1 and preferences is None and ranked:
        ranked = [min(ranked)]  # the first of the sorted list, and the first name of its class
    else:
        ranked.sort()
    options: list[Option] = []
    i = 0
    while i < len(ranked) and len(options) < limit:
        j = i + 1
        while j < len(ranked) and ranked[j][:2] == ranked[i][:2]:
            j += 1
        need = limit - len(options)
        if preferences is not None:  # the first names of each weight in each class, heaviest first
            weighed: list[tuple[int, str, int]] = []
            for *_, k in ranked[i:j]:
                for weight, group in preferences.by_weight(cands[k].names):
                    weighed.extend((-weight, name, k) for name in group[:need])
            weighed.sort()
            for _, name, k in weighed[:need]:
                options.append(option_of(cands[k], name, ctx))
        elif j == i + 1:  # one class: its names are in order already
            cand = cands[ranked[i][3]]
            for name in cand.names[:need]:
                options.append(option_of(cand, name, ctx))
        else:  # equal classes: the first names of each, interleaved by name
            names = []
            for *_, k in ranked[i:j]:
                for name in cands[k].names[:need]:
                    names.append((name, k))
            names.sort()
            for name, k in names[:need]:
                options.append(option_of(cands[k], name, ctx))
        i = j
    return options


def random_options(cands: list[Candidate], topology_first: bool, ctx: PlacementContext) -> list[Option]:
    """Nodes drawn uniformly (seeded), the lowest-loss group first for multi-GPU pods."""
    rng = random.Random(ctx.seed)
    groups: dict[float, list[Candidate]] = {}
    for cand in sorted(cands, key=lambda c: c.names[0]):
        groups.setdefault(cand.loss if topology_first else 0.0, []).append(cand)
    options: list[Option] = []
    for loss in sorted(groups):
        group = groups[loss]
        bounds: list[int] = []
        total = 0
        for cand in group:
            total += len(cand.names)
            bounds.append(total)
        for drawn in rng.sample(range(total), min(total, ctx.limit - len(options))):
            k = bisect_right(bounds, drawn)
            start = bounds[k - 1] if k else 0
            option = option_of(group[k], group[k].names[drawn - start], ctx)
            options.append(option._replace(score=float(ctx.limit - len(options))))
        if len(options) >= ctx.limit:
            break
    return options
