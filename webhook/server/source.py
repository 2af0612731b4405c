"""Where the server's cluster picture comes from, and how an admitted pod is counted before it runs.

`SnapshotSource` is the one interface between the HTTP layer and cluster state: a static source
(files, the demo cluster) lives here; the live watch cache implements the same protocol elsewhere.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from webhook.core.admission.configmap_readers import Reads, env_reads, with_env_reads
from webhook.core.admission.quota import gpu_room
from webhook.core.domain.decision import Decision, denied
from webhook.core.domain.model import Allocation, Snapshot
from webhook.core.placement.group_room import domain_free, has_domains
from webhook.core.placement.groups import GroupRecord, GroupRef
from webhook.core.placement.groups import commit as commit_member
from webhook.core.policy.model import GROUP_LEVELS
from webhook.tally import GroupOutcomes

Decide = Callable[[Snapshot], Decision]
AddAllocation = Callable[[Snapshot, str, Allocation], Snapshot]


@runtime_checkable
class SnapshotSource(Protocol):
    def snapshot(self) -> Snapshot:
        """The current picture, reservations included. Cheap: called for every admission."""
        ...

    def fresh_snapshot(self, namespace: str) -> Snapshot:
        """`snapshot()`, with the namespace's reservations as a store shared with other replicas has them
        now (for a ConfigMap write, which must see the pods any replica just admitted)."""
        ...

    def ready(self) -> tuple[bool, str]:
        """Whether admissions may be answered from it, and why (for /readyz)."""
        ...

    def age_seconds(self) -> float:
        """Seconds since the picture last changed from the cluster's side."""
        ...

    def commit(self, uid: str, namespace: str, decide: Decide, dry_run: bool, *,
               pod: Mapping[str, Any] | None = None) -> Decision:
        """Atomically decide against the current picture and, when allowed, reserve what was decided.

        A reservation is taken only when the decision allows the pod with an allocation and this is not
        a dry run. Two racing commits can never both take the last of a quota. The server passes
        `group=` (core/groups.py) only for a pod of a multi-pod group: a source that keeps group records
        writes the pod into its group's record with the reservation, and refuses it (403
        `group-domain-taken`) when `groups.commit` does. `pod` is the pod itself: the reservation keeps
        what it reads of ConfigMaps through envFrom (core/admission/configmap_readers.py `env_reads`), which the picture
        counts in `env_readers` until the pod itself does.
        """
        ...


def _default_with_allocation(snapshot: Snapshot, namespace: str, allocation: Allocation) -> Snapshot:
    from webhook.core.placement.state import with_allocation

    return with_allocation(snapshot, namespace, allocation)


class StaticSource:
    """A fixed snapshot plus in-process reservations keyed by pod UID.

    Reservations live in this process only: serve it from one worker process (with threads), so every
    admission sees the pods admitted before it. Nothing ever releases them; this source is meant for
    demos, tests and offline checks, where the cluster never moves.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        description: str = "static snapshot",
        clock: Callable[[], float] = time.monotonic,
        add_allocation: AddAllocation = _default_with_allocation,
        group_levels: tuple[str, ...] | None = None,
    ) -> None:
        self._base = snapshot
        self._current = snapshot
        self._description = description
        self._clock = clock
        self._loaded_at = clock()
        self._add_allocation = add_allocation
        # topology levels a group could be split over (for the split count): the policy default's
        self._split_over = group_levels if group_levels is not None else GROUP_LEVELS
        self._reservations: dict[str, tuple[str, Allocation]] = {}
        self._reads: dict[str, Reads] = {}  # pod UID -> its envFrom reads, for pods that have some
        self._groups: dict[str, GroupRecord] = {}  # multi-pod groups' domains (core/groups.py)
        self.outcomes = GroupOutcomes()
        self._lock = threading.Lock()

    def snapshot(self) -> Snapshot:
        return self._current

    def fresh_snapshot(self, namespace: str) -> Snapshot:
        return self._current  # every reservation is this process's own

    def ready(self) -> tuple[bool, str]:
        return (
            True,
            f"{self._description}: {len(self._base.nodes)} nodes, {len(self._reservations)} reservations",
        )

    def age_seconds(self) -> float:
        return max(0.0, self._clock() - self._loaded_at)

    def group_outcomes(self) -> dict[str, int]:
        """Groups placed whole, split and waiting (for /metrics)."""
        return dict(self.outcomes.counts)

    def reservations(self) -> dict[str, tuple[str, Allocation]]:
        """A copy of the reservations taken so far: pod UID -> (namespace, allocation)."""
        with self._lock:
            return dict(self._reservations)

    def reservation_count(self) -> int:
        return len(self._reservations)

    def largest_written(self) -> int:
        """Nothing is written anywhere: cluster files are read, reservations kept here."""
        return 0

    def commit(
        self, uid: str, namespace: str, decide: Decide, dry_run: bool, group: GroupRef | None = None,
        pod: Mapping[str, Any] | None = None,
    ) -> Decision:
        with self._lock:
            seen_before = uid in self._reservations
            # The same pod seen again (a retried call) is judged without counting it twice.
            view = self._rebuild(exclude=uid) if seen_before else self._current
            decision = decide(view)
            if dry_run or not uid or not decision.allowed or decision.allocation is None:
                return decision
            allocation = decision.allocation
            if group is not None and allocation.group and allocation.domain:
                level, _, value = allocation.domain.partition("=")
                room = domain_free(view, allocation.domain)
                quota = gpu_room(namespace, view)
                outcome = commit_member(self._groups, group, level, value, allocation.gpu_count, uid, free=room,
                                        quota_room=None if quota is None else quota - allocation.gpu_count)
                if isinstance(outcome, str):
                    self.outcomes.count("waiting", group.key)
                    return denied(403, "group-domain-taken",
                                  f"{outcome}; not admitted: its controller creates it again",
                                  warnings=decision.warnings)
                self._groups[outcome.key] = outcome
                self.outcomes.placed(group.key, allocation.domain, room, (group.size or group.minimum)
                                     * allocation.gpu_count, outcome.members == (uid,))
            elif group is not None and allocation.group and has_domains(view, self._split_over):
                # admitted with no domain where there were some: the group is split
                self.outcomes.placed(group.key, "", 0, 0, False)
            self._reservations[uid] = (namespace, allocation)
            _, name, reads = env_reads(pod, True) if pod is not None else ("", "", None)
            if reads:
                self._reads[uid] = (namespace, name, reads)
            else:
                self._reads.pop(uid, None)
            if seen_before:
                self._current = self._rebuild(exclude=None)
            else:
                self._current = self._add_allocation(view, namespace, allocation)
                if reads:
                    self._current = replace(self._current, env_readers=with_env_reads(
                        self._current.env_readers, [(namespace, name, reads)]))
            if self._groups:
                self._current = replace(self._current, groups=dict(self._groups))
            return decision

    def _rebuild(self, exclude: str | None) -> Snapshot:
        snapshot = self._base
        for uid, (namespace, allocation) in self._reservations.items():
            if uid != exclude:
                snapshot = self._add_allocation(snapshot, namespace, allocation)
        reads = [found for uid, found in self._reads.items() if uid != exclude]
        if reads:
            snapshot = replace(snapshot, env_readers=with_env_reads(snapshot.env_readers, reads))
        return replace(snapshot, groups=dict(self._groups)) if self._groups else snapshot
