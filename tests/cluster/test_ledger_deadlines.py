"""The shared ledger's writes: bounded by the admission's budget, backed off with jitter, 429s and 5xx
retried, a deleted ledger written anew, every call with a request timeout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from ledger_support import FakeConfigMaps

from webhook.cluster.reservations import (
    ApiStore,
    Entries,
    Reservation,
    ReservationConflict,
    ReservationStoreError,
    TimedConfigMaps,
)
from webhook.core.domain.model import Allocation, TopologyClass

NAME = ("gpu-admission", "gpu-admission-ledger-team-a")


class Clock:
    """Time that moves only when the store sleeps (or a call takes time)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def store(api: Any, clock: Clock, budget: float = 3.5) -> ApiStore:
    return ApiStore(api, "gpu-admission", budget_seconds=budget, clock=clock, sleep=clock.sleep, jitter=lambda top: top)


def add(uid: str) -> Callable[[Entries], tuple[Entries | None, str]]:
    allocation = Allocation(
        "n1", (0,), 1, 81559, 100, "nvidia", "NVIDIA-H100-80GB-HBM3", TopologyClass.SINGLE, 0.0, "binpack"
    )

    def change(entries: Entries) -> tuple[Entries | None, str]:
        return (*entries, Reservation(uid, "team-a", allocation, 1e12)), uid

    return change


class Failing(FakeConfigMaps):
    """Answers the first `times` writes with `status`, then behaves."""

    def __init__(self, status: int, times: int) -> None:
        super().__init__(conflict_rate=0.0)
        self.status, self.times = status, times

    def replace_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any]) -> Any:
        if self.times > 0:
            self.times -= 1
            raise ApiException(status=self.status, reason="injected")
        return super().replace_namespaced_config_map(name, namespace, body)


@pytest.mark.parametrize("status", [409, 429, 500, 503, 504])
def test_transient_answers_are_retried_with_growing_waits(status: int) -> None:
    api, clock = Failing(status, 0), Clock()
    ledger = store(api, clock)
    ledger.transact("team-a", add("first"))  # creates the object
    api.times = 4
    assert ledger.transact("team-a", add("second")) == "second"
    assert api.uids() == ["first", "second"]
    assert clock.waits == [0.005, 0.01, 0.02, 0.04]  # full jitter draws from [0, these]
    assert ledger.retries == 4


def test_waits_are_capped_and_the_transaction_ends_within_its_budget() -> None:
    api, clock = Failing(409, 0), Clock()
    ledger = store(api, clock, budget=1.0)
    ledger.transact("team-a", add("first"))
    api.times = 10**6
    with pytest.raises(ReservationConflict) as gave_up:
        ledger.transact("team-a", add("late"))
    assert "within 1 s" in str(gave_up.value) and "HTTP 409" in str(gave_up.value)
    assert clock.now < 1.0 and max(clock.waits) == ApiStore.MAX_BACKOFF
    assert api.uids() == ["first"]  # nothing written for the admission that gave up


def test_a_refusal_that_will_not_change_is_not_retried() -> None:
    api, clock = Failing(403, 0), Clock()
    ledger = store(api, clock)
    ledger.transact("team-a", add("first"))
    api.times = 1
    with pytest.raises(ReservationStoreError) as refused:
        ledger.transact("team-a", add("second"))
    assert "HTTP 403" in str(refused.value) and clock.waits == []


def test_a_deleted_ledger_is_written_anew_by_the_next_admission() -> None:
    api, clock = FakeConfigMaps(conflict_rate=0.0), Clock()
    ledger = store(api, clock)
    ledger.transact("team-a", add("first"))
    del api.objects[NAME]  # deleted by hand, or by a namespace cleanup
    assert ledger.transact("team-a", add("second")) == "second"
    assert api.uids() == ["second"]  # the deleted entries are gone with their object; the watch counts their pods


def test_a_replica_waiting_for_its_turn_gives_up_at_the_budget() -> None:
    api, clock = FakeConfigMaps(conflict_rate=0.0), Clock()
    ledger = store(api, clock, budget=0.05)
    lock = ledger._lock_of("team-a")
    lock.acquire()
    try:
        with pytest.raises(ReservationConflict) as busy:
            ledger.transact("team-a", add("x"))
    finally:
        lock.release()
    assert "busy for 0.05 s" in str(busy.value)


def test_every_call_carries_a_request_timeout() -> None:
    seen: list[tuple[str, Any]] = []

    class Recorder:
        def __getattr__(self, name: str) -> Callable[..., None]:
            return lambda *args, **kwargs: seen.append((name, kwargs.get("_request_timeout")))

    timed = TimedConfigMaps(Recorder(), connect_seconds=1.5, read_seconds=2.5)
    timed.read_namespaced_config_map("a", "ns")
    timed.create_namespaced_config_map("ns", {})
    timed.replace_namespaced_config_map("a", "ns", {})
    assert seen == [
        (name, (1.5, 2.5))
        for name in ("read_namespaced_config_map", "create_namespaced_config_map", "replace_namespaced_config_map")
    ]
