"""With one decider (the chart's default for several replicas) reservations and group records live in
its memory: nothing grows toward the API server's 1 MiB object limit. 5,000 admissions in flight in
one namespace and 20,000 members of live groups are all taken, and nothing is written."""

from __future__ import annotations

import time
from dataclasses import replace

from ledger_support import H100, cluster_cache

from webhook.cluster.group_ledger import GroupLedger
from webhook.cluster.reservations import InProcessStore, Ledger
from webhook.cluster.source import LiveSource
from webhook.core.domain.decision import Decision
from webhook.core.domain.model import Allocation, Snapshot, TopologyClass
from webhook.core.placement.groups import GroupRef

ONE_GPU = Allocation(None, (), 1, 81559, 100, "nvidia", H100, TopologyClass.SINGLE, 0.0, "binpack")


def test_five_thousand_admissions_in_flight_in_one_namespace_are_all_taken() -> None:
    cache = cluster_cache(used=0, quota=10_000)
    source = LiveSource(cache, Ledger(InProcessStore(), clock=time.time))

    def decide(_snapshot: Snapshot) -> Decision:
        return Decision(True, allocation=ONE_GPU)

    refused = [i for i in range(5000) if not source.commit(f"uid-{i}", "team-a", decide, False).allowed]
    assert refused == []
    assert source.reservation_count() == 5000
    assert source.snapshot().namespace_usage["team-a"].gpus == 5000
    assert source.largest_written() == 0  # held in memory: no object, no cliff


def test_twenty_thousand_members_of_live_groups_are_all_recorded() -> None:
    ledger = GroupLedger(InProcessStore())
    member = replace(ONE_GPU, group="g", domain="topology.kubernetes.io/zone=a")
    for g in range(200):
        ref = GroupRef("team-a", f"pytorchjob/job-{g}", 100, "training.kubeflow.org/job-name", 100)
        for m in range(100):
            outcome = ledger.commit(ref, member, f"uid-{g}-{m}", free=lambda _records: 10**9)
            assert not isinstance(outcome, str), outcome
    records = ledger.records()
    assert len(records) == 200 and sum(len(r.members) for r in records.values()) == 20_000
