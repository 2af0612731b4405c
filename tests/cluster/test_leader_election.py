"""The decider lease: one leader at a time by each replica's own clock, whatever the wall clocks say; a
leader that cannot renew stops deciding before anyone may take over; a new leader waits out its
predecessor's answers."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from webhook.cluster.leader import PEER_ANNOTATION, LeaseConflict, LeaseElector


class FakeLeases:
    """One Lease with resourceVersion preconditions, as the API server keeps it; `down` fails every call."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down = False
        self.writes = 0

    def read(self) -> Mapping[str, Any] | None:
        self._check()
        return copy.deepcopy(self.lease)

    def create(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self._check()
        if self.lease is not None:
            raise LeaseConflict("exists")
        return self._store(body)

    def replace(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self._check()
        if self.lease is None:
            raise LeaseConflict("gone")
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise LeaseConflict("conflict")
        return self._store(body)

    def _store(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.version += 1
        self.writes += 1
        self.lease = copy.deepcopy(dict(body))
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)

    def _check(self) -> None:
        if self.down:
            raise TimeoutError("API server unreachable")


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def replica(leases: FakeLeases, name: str, clock: Clock) -> LeaseElector:
    return LeaseElector(leases, name, f"https://{name}:8443", takeover_wait=5.0, clock=clock)


def advance(seconds: float, clocks: list[Clock], electors: list[LeaseElector], step: float = 2.0) -> None:
    """Every replica runs its round every `step` seconds for `seconds`."""
    done = 0.0
    while done < seconds:
        for clock in clocks:
            clock.now += step
        for elector in electors:
            elector.step()
        done += step


def test_one_leader_decides_after_its_wait_and_the_others_forward_to_it() -> None:
    leases = FakeLeases()
    clocks = [Clock(0.0), Clock(5000.0), Clock(-300.0)]  # unrelated monotonic clocks
    a, b, c = (replica(leases, n, k) for n, k in zip("abc", clocks, strict=True))
    a.step()
    b.step()
    c.step()
    assert a.state().leader and not a.state().deciding  # waits out a predecessor it cannot know of
    assert b.state().peer == c.state().peer == "https://a:8443"
    assert not b.state().leader and not c.state().leader
    advance(6, clocks, [a, b, c])
    assert a.state().deciding and not b.state().deciding and not c.state().deciding
    assert leases.lease is not None and leases.lease["metadata"]["annotations"][PEER_ANNOTATION] == "https://a:8443"


def test_a_leader_cut_off_from_the_api_server_stops_deciding_before_anyone_takes_over() -> None:
    leases = FakeLeases()
    clocks = [Clock(0.0), Clock(100.0)]
    a, b = replica(leases, "a", clocks[0]), replica(leases, "b", clocks[1])
    a.step()
    b.step()
    advance(6, clocks, [a, b])
    assert a.state().deciding
    history: list[tuple[float, bool, bool]] = []
    # a cannot reach the API server any more; b still can.
    real_read = leases.read

    def read_for(elector: LeaseElector) -> Any:
        def read() -> Mapping[str, Any] | None:
            if elector is a:
                raise TimeoutError("partitioned")
            return real_read()
        return read

    t = 0.0
    while t < 40:
        for clock in clocks:
            clock.now += 1.0
        t += 1.0
        leases.read = read_for(a)  # type: ignore[method-assign]
        a.step()
        leases.read = read_for(b)  # type: ignore[method-assign]
        b.step()
        history.append((t, a.state().deciding, b.state().deciding))
    assert not any(ad and bd for _, ad, bd in history), "two deciders at once"
    stopped = min(t for t, ad, _ in history if not ad)
    started = min(t for t, _, bd in history if bd)
    assert stopped <= 10 and started >= stopped + 5 + 5  # lease outlives the renew deadline, then the wait
    assert b.state().leader and b.transitions == 1


def test_wall_clock_skew_hands_nothing_over_early() -> None:
    """Renew times are written for people; a follower ten minutes ahead still waits for the lease to go
    silent on its own clock."""
    leases = FakeLeases()
    clocks = [Clock(0.0), Clock(600.0)]
    a, b = replica(leases, "a", clocks[0]), replica(leases, "b", clocks[1])
    a.step()
    assert leases.lease is not None
    leases.lease["spec"]["renewTime"] = "2000-01-01T00:00:00.000000Z"  # a renewal time far in the past
    advance(60, clocks, [a, b])
    assert a.state().deciding and not b.state().leader


def test_a_deleted_lease_is_made_again_by_one_replica() -> None:
    leases = FakeLeases()
    clocks = [Clock(0.0), Clock(0.0)]
    a, b = replica(leases, "a", clocks[0]), replica(leases, "b", clocks[1])
    a.step()
    b.step()
    leases.lease = None
    b.step()  # b creates it first and must wait before deciding
    a.step()  # a sees b hold it: a stops deciding at once
    assert b.state().leader and not b.state().deciding
    assert not a.state().leader and a.state().peer == "https://b:8443"


def test_the_periods_must_leave_no_overlap() -> None:
    with pytest.raises(ValueError):
        LeaseElector(FakeLeases(), "a", "https://a", lease_seconds=10, renew_deadline=10)


def test_the_lease_stays_the_same_size_however_long_it_is_renewed() -> None:
    """The only object the replicas write: its size is bounded, whatever the pods and the hours."""
    leases = FakeLeases()
    clock = Clock(0.0)
    a = replica(leases, "a", clock)
    a.step()
    first = a.largest_write
    advance(600, [clock], [a])
    assert leases.writes > 250 and a.largest_write < first + 64 < 1024  # only its resourceVersion grows


def test_a_hand_edited_lease_naming_no_replica_is_taken_over_once_it_goes_silent() -> None:
    leases = FakeLeases()
    clocks = [Clock(0.0), Clock(0.0)]
    a, b = replica(leases, "a", clocks[0]), replica(leases, "b", clocks[1])
    a.step()
    b.step()
    assert leases.lease is not None
    edited = dict(leases.lease)
    edited["spec"] = {**leases.lease["spec"], "holderIdentity": "someone-else"}
    leases.replace(edited)  # kubectl edit: a holder that runs nowhere
    a.step()
    b.step()
    assert not a.state().leader and not b.state().leader  # nobody decides for the named holder's term
    advance(20, clocks, [a, b])
    holders = [e for e in (a, b) if e.state().leader]
    assert len(holders) == 1 and not holders[0].state().deciding  # one took it over, and waits first
    advance(6, clocks, [a, b])
    assert holders[0].state().deciding
