"""The group ledger: which domain each multi-pod group took, kept next to the reservations.

A group's first admitted pod fixes its domain (core/groups.py); every replica of the webhook and every
restart must agree on it, and two groups racing for the last free domain must never both get it. The
records of all namespaces live in ONE store partition (one ConfigMap `gpu-admission-groups` in the
webhook's namespace for the shared store), because groups of different namespaces compete for the same
domains; each member is recorded through `core.groups.commit` inside a transaction on it, so the
resourceVersion precondition turns a race into one winner and one refusal.

A record expires when its pods are gone: no member in the watch cache and no live reservation, for
`grace_seconds` (the controller re-creating a failed pod keeps the domain).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from webhook.core.domain.model import Allocation
from webhook.core.domain.names import LEDGER_LABEL, MANAGED_BY_LABEL
from webhook.core.placement.group_room import domain_free, split_domain, unseen_members
from webhook.core.placement.groups import (
    GroupRecord,
    GroupRef,
    commit,
    record_from_json,
    record_to_json,
    without_member,
)

from .reservations import ApiStore, InProcessStore, ReservationStore

log = logging.getLogger(__name__)

PARTITION = "groups"  # the one store key all group records live under
CONFIG_MAP = "gpu-admission-groups"
REFUSAL_REASON = "group-domain-taken"


@dataclass(frozen=True)
class StoredGroup:
    """A record as the ledger keeps it, with when it was last found without a live member."""

    record: GroupRecord
    idle_since: float | None = None  # clock seconds; None while some member lives

    @property
    def key(self) -> str:
        return self.record.key

    def to_json(self) -> dict[str, Any]:
        data = {"record": record_to_json(self.record)}
        if self.idle_since is not None:
            data["idleSince"] = round(self.idle_since, 3)  # type: ignore[assignment]
        return data

    @classmethod
    def from_json(cls, data: Any) -> StoredGroup:
        if not isinstance(data, dict):
            raise ValueError("group entry is not an object")
        idle = data.get("idleSince")
        if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int | float)):
            raise ValueError("group entry: idleSince is not a number")
        return cls(record_from_json(data.get("record")), None if idle is None else float(idle))


Groups = tuple[StoredGroup, ...]


class GroupApiStore(ApiStore):
    """The shared store: all records in one ConfigMap of the webhook's namespace, replaced with a
    resourceVersion precondition (the same retry-on-409 loop as the reservation ConfigMaps)."""

    DATA_KEY = "groups"

    def __init__(self, api: Any, namespace: str, *, name: str = CONFIG_MAP, max_attempts: int = 50,
                 budget_seconds: float = 3.5) -> None:
        super().__init__(api, namespace, max_attempts=max_attempts, budget_seconds=budget_seconds)
        self.config_map = name

    def name_of(self, namespace: str) -> str:
        return self.config_map

    def refresh(self) -> None:
        """Read the object again (another replica may have written): picked up by the next snapshot."""
        self._guarded("read", PARTITION, self._read, PARTITION)

    def _decode(self, namespace: str, data: dict[str, str]) -> Any:
        try:
            raw = json.loads(data.get(self.DATA_KEY) or "[]")
            if not isinstance(raw, list):
                raise ValueError("expected a JSON list")
            return tuple(StoredGroup.from_json(item) for item in raw)
        except ValueError as error:  # hand-edited: groups lose their domain, pods are still admitted
            log.error("group ledger %s/%s is unreadable (%s); treating it as empty", self.namespace,
                      self.config_map, error)
            return ()

    def _write(self, namespace: str, resource_version: str | None, entries: Any) -> str:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.config_map,
                "namespace": self.namespace,
                "labels": {MANAGED_BY_LABEL: "gpu-admission", LEDGER_LABEL: "groups"},
            },
            "data": {self.DATA_KEY: json.dumps([e.to_json() for e in entries], separators=(",", ":"))},
        }
        self.largest_write = max(self.largest_write, len(body["data"][self.DATA_KEY].encode()))
        if resource_version is None:
            created = self.api.create_namespaced_config_map(self.namespace, body)
            return str(created.metadata.resource_version)
        body["metadata"]["resourceVersion"] = resource_version
        replaced = self.api.replace_namespaced_config_map(self.config_map, self.namespace, body)
        return str(replaced.metadata.resource_version)


class GroupLedger:
    """Records group members in a store; `records()` is what `Snapshot.groups` gets."""

    def __init__(self, store: ReservationStore | None = None, *, grace_seconds: float = 300.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store: ReservationStore = store or InProcessStore()
        self.grace_seconds = grace_seconds
        self.clock = clock
        self._cached: tuple[int, dict[str, GroupRecord]] | None = None
        self._lock = threading.Lock()
        self._loaded = not callable(getattr(self.store, "refresh", None))  # a shared store is read once first

    @property
    def version(self) -> int:
        return self.store.version

    @property
    def conflicts(self) -> int:
        return self.store.conflicts

    def records(self) -> Mapping[str, GroupRecord]:
        """Every record this process knows of, by key; only the first call of a new process reads the
        shared store (a restarted replica must know the domains taken before it)."""
        if not self._loaded:
            self._loaded = True
            try:
                self.refresh()
            except Exception as error:  # the prune loop reads it again
                log.warning("group ledger not read yet: %s", error)
        version = self.store.version
        cached = self._cached
        if cached is not None and cached[0] == version:
            return cached[1]
        records = {entry.key: entry.record for entry in self.store.known() if isinstance(entry, StoredGroup)}
        with self._lock:
            self._cached = (version, records)
        return records

    def commit(self, ref: GroupRef, allocation: Allocation, member: str, *,
               free: Callable[[Mapping[str, GroupRecord]], int] | None = None,
               quota_room: int | None = None) -> GroupRecord | str:
        """Record `member` of `ref` in the domain its allocation names: the record, or the refusal of
        `core.groups.commit` (the domain is no longer the group's to take: another group's pods still
        to come need it). `free(records)`: the domain's free GPUs before this member, given the records
        as the transaction reads them. Written atomically against every other replica's records."""
        level, domain = split_domain(allocation.domain)

        def change(entries: Groups) -> tuple[Groups | None, GroupRecord | str]:
            by_key = {e.key: e for e in entries}
            records = {k: e.record for k, e in by_key.items()}
            outcome = commit(records, ref, level, domain, allocation.gpu_count, member,
                             free=None if free is None else free(records), quota_room=quota_room)
            if isinstance(outcome, str):
                return None, outcome
            before = by_key.get(outcome.key)
            if before is not None and before.record == outcome and before.idle_since is None:
                return None, outcome  # a retried admission of the same pod: nothing to write
            by_key[outcome.key] = StoredGroup(outcome)
            return tuple(by_key[k] for k in sorted(by_key)), outcome

        outcome = self.store.transact(PARTITION, change)
        if isinstance(outcome, str) and callable(getattr(self.store, "refresh", None)):
            # A refusal writes nothing, so no precondition proved our copy current: read again first.
            self.refresh()
            outcome = self.store.transact(PARTITION, change)
        return outcome

    def forget(self, key: str, member: str) -> None:
        """Take `member` out of its group's record again (its admission was not recorded after all);
        a record left with no member goes."""

        def change(entries: Groups) -> tuple[Groups | None, None]:
            kept: list[StoredGroup] = []
            changed = False
            for entry in entries:
                if entry.key == key and member in entry.record.members:
                    changed = True
                    record = without_member(entry.record, member)
                    if record is not None:
                        kept.append(replace(entry, record=record))
                    continue
                kept.append(entry)
            return (tuple(kept) if changed else None), None

        self.store.transact(PARTITION, change)

    def prune(self, alive: Callable[[str], bool], gone: Callable[[str], bool] = lambda member: False) -> int:
        """Members the watch saw deleted (`gone`) leave their record, so the group expects their
        replacements; a record none of whose members is `alive` starts its grace, and goes when the
        grace has run out. Returns how many records went."""
        now = self.clock()

        def change(entries: Groups) -> tuple[Groups | None, int]:
            kept: list[StoredGroup] = []
            changed = False
            for entry in entries:
                record = entry.record
                members = tuple(m for m in record.members if not gone(m))
                living = any(alive(m) for m in members)
                idle = None if living else (entry.idle_since if entry.idle_since is not None else now)
                if idle is not None and now - idle >= self.grace_seconds:
                    changed = True
                    continue
                updated = StoredGroup(replace(record, members=members) if members != record.members else record, idle)
                changed = changed or updated != entry
                kept.append(updated)
            return (tuple(kept) if changed else None), len(entries) - len(kept)

        return self.store.transact(PARTITION, change)

    def refresh(self) -> None:
        """Pick up other replicas' writes (a shared store); nothing to do in one process."""
        refresh = getattr(self.store, "refresh", None)
        if callable(refresh):
            refresh()


def records_in(objects: Any) -> dict[str, GroupRecord]:
    """The group records of a `gpu-admission-groups` ConfigMap among cluster objects (as `check
    --kubeconfig` lists them, or a file of them), so an offline check follows the groups already placed.
    An unreadable one is skipped, as the webhook would treat it."""
    records: dict[str, GroupRecord] = {}
    for obj in objects:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping) or obj.get("kind") != "ConfigMap":
            continue
        labels = meta.get("labels")
        if not isinstance(labels, Mapping) or labels.get(LEDGER_LABEL) != "groups":
            continue
        data = obj.get("data")
        try:
            raw = json.loads(data.get(GroupApiStore.DATA_KEY) or "[]") if isinstance(data, Mapping) else []
            for item in raw if isinstance(raw, list) else ():
                entry = StoredGroup.from_json(item)
                records[entry.key] = entry.record
        except ValueError as error:
            log.warning("group ledger %s/%s is unreadable (%s): ignored", meta.get("namespace"), meta.get("name"),
                        error)
    return records


def refusal_message(ref: GroupRef, why: str) -> str:
    """The denial's text: what happened, and that the pod's controller retries it."""
    return (f"{why}; this pod was not admitted and nothing was reserved: its controller "
            "creates it again and it is then placed with the group's new domain (or waits for one to free up)")


__all__ = ["GroupLedger", "GroupApiStore", "StoredGroup", "split_domain", "domain_free", "unseen_members",
           "refusal_message", "records_in", "REFUSAL_REASON", "CONFIG_MAP", "PARTITION"]
