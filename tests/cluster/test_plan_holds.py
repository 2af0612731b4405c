"""Plans between the two webhooks: the pods of a burst are mutated one at a time, each seeing the GPUs
the plans before it took, so a job launch is planned onto free cards and nodes instead of all onto the
same one; a plan holds no quota, ends at its pod's validation, and lapses when no validation comes."""

from __future__ import annotations

import threading
from typing import Any

from ledger_support import cluster_cache

from webhook.cluster.reservations import InProcessStore, Ledger
from webhook.cluster.source import HOLD_SECONDS, LiveSource
from webhook.core.admission import admit
from webhook.core.policy.model import Policy

KEY = b"k" * 32


def exclusive_pod(name: str) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]}}


def source(now: list[float]) -> LiveSource:
    cache = cluster_cache(used=0, quota=64)  # two 8-GPU nodes
    return LiveSource(cache, Ledger(InProcessStore(), clock=lambda: now[0]))


def plan(live: LiveSource, name: str, dry_run: bool = False) -> Any:
    decision = live.plan(lambda snap: admit.mutate(exclusive_pod(name), snap, Policy(), namespace="team-a",
                                                   record_key=KEY, nonce=name), name, dry_run)
    assert decision.allowed, decision.message
    return decision.allocation


def test_a_burst_of_plans_takes_sixteen_different_cards() -> None:
    live = source([1000.0])
    taken: list[tuple[str, int]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        allocation = plan(live, f"p{i}")
        with lock:
            taken.append((allocation.node, allocation.gpus[0]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(taken)) == 16  # every card of both nodes, each once
    # the seventeenth finds no card free now (and holds nothing: no quota was taken by the plans)
    assert plan(live, "p16").node is None
    assert live.snapshot().namespace_usage.get("team-a") is None or live.snapshot().namespace_usage[
        "team-a"].gpus == 0


def test_validation_ends_a_plan_and_an_unvalidated_plan_lapses() -> None:
    now = [1000.0]
    live = source(now)
    first = plan(live, "a")
    second = plan(live, "b")
    assert (first.node, first.gpus) != (second.node, second.gpus)
    assert busy_cards(live) == 2
    live.release("a")  # validated (or refused): what it held is counted by its reservation from now on
    assert busy_cards(live) == 1
    plan(live, "c")
    plan(live, "d")
    assert busy_cards(live) == 3
    now[0] += HOLD_SECONDS + 1  # b, c, d never validated: refused elsewhere, or never sent on
    fresh = [plan(live, f"n{i}") for i in range(16)]
    assert len({(a.node, a.gpus) for a in fresh}) == 16


def busy_cards(live: LiveSource) -> int:
    return sum(1 for usage in live.snapshot().usage.values() for gpu in usage.gpus if gpu.tasks)


def test_a_dry_run_plans_alike_and_holds_nothing() -> None:
    live = source([1000.0])
    dry = plan(live, "dry", dry_run=True)
    real = plan(live, "real")
    assert (dry.node, dry.gpus) == (real.node, real.gpus)
    assert busy_cards(live) == 1
