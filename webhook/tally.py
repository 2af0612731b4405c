"""Tallies kept for the life of a server process and reported by /metrics: state with a lock, so kept
out of the pure core, below the layers (server, cluster) whose sources count into them."""

from __future__ import annotations

import threading


class GroupOutcomes:
    """How groups were placed, each group counted once per outcome (for /metrics): `whole` (its first
    pod took a domain with room for all of it), `split` (preferred mode: admitted with no domain, its
    pods spread), `waiting` (no room: its domain is busy and its pods wait there, or a pod was refused
    because another group's pods still to come hold the domain). Only the last `memory` group keys are
    remembered, so a long-lived webhook stays small."""

    OUTCOMES = ("whole", "split", "waiting")

    def __init__(self, memory: int = 10000) -> None:
        self.counts = dict.fromkeys(self.OUTCOMES, 0)
        self._seen: dict[tuple[str, str], None] = {}  # insertion-ordered: oldest first
        self._memory = memory
        self._lock = threading.Lock()  # the server's threads count concurrently

    def count(self, outcome: str, key: str) -> None:
        with self._lock:
            if (outcome, key) in self._seen:
                return
            self._seen[(outcome, key)] = None
            if len(self._seen) > self._memory:
                del self._seen[next(iter(self._seen))]
            self.counts[outcome] += 1

    def placed(self, key: str, domain: str, room: int, needs: int, first: bool) -> None:
        """A member admitted: `domain` "" for a split group; `room`/`needs` the domain's free GPUs and
        what the group takes, weighed when `first` (the record was just made)."""
        if not domain:
            self.count("split", key)
        elif first:
            self.count("whole" if room >= needs else "waiting", key)

