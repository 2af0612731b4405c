"""How much room a topology domain has for a group, as a caller's snapshot and the group records count it.

Pure helpers for whoever records group members (the ledger in cluster/, the static source in server/,
`check`): `core.groups.commit` weighs a new group against the domain's free GPUs they compute.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from webhook.core.domain.model import Snapshot

from .groups import GroupRecord
from .state import index_of


def split_domain(domain: str) -> tuple[str, str]:
    """"nvidia.com/gpu.clique=abc.1" -> ("nvidia.com/gpu.clique", "abc.1")."""
    level, _, value = domain.partition("=")
    return level, value


def unseen_members(records: Mapping[str, GroupRecord], domain: str, besides: str,
                   counted: Callable[[str], bool]) -> int:
    """GPUs of other groups' members in `domain` that the caller's picture does not count yet (admitted
    by another replica in another namespace, pod not seen by our watch): taken, though not shown."""
    level, value = split_domain(domain)
    return sum(r.gpus_per_pod for r in records.values() if (r.level, r.domain) == (level, value)
               and r.key != besides for m in r.members if not counted(m))


def domain_free(snapshot: Snapshot, domain: str) -> int:
    """Healthy GPUs with nothing on them on the schedulable nodes of `domain` ("label=value"), as the
    snapshot counts them (reservations included): what `core.groups.commit` weighs a new group against.
    Two whole-card pods on one card (replicas that raced to the same GPUs) take two cards' worth."""
    level, value = split_domain(domain)
    free = 0
    # The nodes of the domain from the placement index's label index (built once per node set), so a
    # group pod's commit reads its domain's nodes only, not the cluster's.
    names = index_of(snapshot).statics.label_index().by_label.get(level, {}).get(value, ())
    for name in names:
        node = snapshot.nodes.get(name)
        if node is None or node.unschedulable:
            continue
        used = snapshot.usage.get(name)
        taken = used.gpus if used is not None else ()
        healthy, busy = 0, 0
        for position, gpu in enumerate(node.gpus):
            healthy += gpu.healthy
            u = taken[position] if position < len(taken) else None
            if u is not None and (u.exclusive or u.tasks or u.memory_mib or u.cores):
                busy += max(u.tasks, 1) if u.exclusive else 1
        free += max(healthy - busy, 0)
    return free


__all__ = ["split_domain", "domain_free", "unseen_members", "has_domains"]


def has_domains(snapshot: Snapshot, levels: tuple[str, ...]) -> bool:
    """Whether any node carries one of the topology levels (else a group has nothing to be split over)."""
    by_label = index_of(snapshot).statics.label_index().by_label
    return any(by_label.get(level) for level in levels)
