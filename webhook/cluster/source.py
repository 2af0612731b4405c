"""The live snapshot source: the watch cache plus the reservation ledger, as the server sees them.

Every decision is made against the cache's picture with the reservations it does not count yet folded
in; the ledger's store makes the decide-then-record step atomic (a lock in one process, a
resourceVersion precondition across replicas).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from webhook.core.admission.configmap_readers import env_reads, with_env_reads
from webhook.core.admission.quota import gpu_room
from webhook.core.domain.decision import Decision, denied
from webhook.core.domain.model import Allocation, NodeUsage, Snapshot, Usage
from webhook.core.domain.shapes import EMPTY
from webhook.core.placement.group_room import has_domains
from webhook.core.placement.groups import GroupRef, sized
from webhook.core.placement.state import add_to_node, index_of, with_usage
from webhook.core.policy.model import Policy
from webhook.policyfile.holder import PolicyHolder
from webhook.tally import GroupOutcomes

from .cache import ClusterCache
from .group_ledger import REFUSAL_REASON, GroupLedger, domain_free, refusal_message, unseen_members
from .leader import Leadership, LeaseElector
from .observe import allocation_shape
from .reservations import Entries, Ledger, Reservation, ReservationStoreError
from .upkeep import Upkeep

log = logging.getLogger(__name__)

Decide = Callable[[Snapshot], Decision]
# How long a plan holds its GPUs for the validation of its pod: the API server calls the validating
# webhook within the request's timeout (the chart's is 5 s), so a plan older than that is for a pod that
# was refused, or never sent on.
HOLD_SECONDS = 10.0


def with_reservations(snapshot: Snapshot, reservations: Iterable[Reservation]) -> Snapshot:
    """`snapshot` counting every reservation: the same result as folding `state.with_allocation` over
    them, with one copy of each mapping instead of one per reservation."""
    entries = list(reservations)
    if not entries:
        return snapshot
    ns_usage = dict(snapshot.namespace_usage)
    changed: dict[str, NodeUsage] = {}
    for entry in entries:
        ns_usage[entry.namespace] = ns_usage.get(entry.namespace, Usage()) + entry.allocation.usage()
        node = snapshot.nodes.get(entry.allocation.node or "")
        if node is not None and entry.allocation.gpus:
            before = changed.get(node.name) or snapshot.usage.get(node.name, NodeUsage())
            changed[node.name] = add_to_node(node, before, entry.allocation)
    # The base's index is built once per base snapshot; each admission's snapshot follows from it.
    index_of(snapshot)
    # Admitted pods count in the learned workload mix as they will once the watch shows them.
    observed = (snapshot.observed or EMPTY).plus(allocation_shape(e.allocation, snapshot.nodes) for e in entries)
    # So do the ConfigMaps they read through envFrom: a write the pod would take at its next container
    # start is refused before the watch shows the pod (core/admission/configmap_writes.py `config_map_write`).
    readers = snapshot.env_readers
    if any(e.reads for e in entries):
        readers = with_env_reads(readers, (e.env_reads() for e in entries))
    return with_usage(snapshot, changed, namespace_usage=ns_usage, observed=observed, env_readers=readers)


class LiveSource:
    """`SnapshotSource` over a `ClusterCache` and a `Ledger`.

    `policy` is called for each admission (the policy file may be reloaded): its `stale_*` and
    `on_stale` fields say how long a silent cache is trusted and what happens after.
    `keep_seconds`: how long a finished reservation (expired, or its pod seen by the watch) stays in
    the store before it is deleted: 0 for one replica; for a shared store, the longest a replica may go
    on answering from a silent watch (stale after + grace), so no replica loses an entry it still needs.
    """

    def __init__(
        self,
        cache: ClusterCache,
        ledger: Ledger | None = None,
        policy: Callable[[], Policy] = Policy,
        *,
        keep_seconds: float = 0.0,
        groups: GroupLedger | None = None,
    ) -> None:
        self.cache = cache
        self.ledger = ledger or Ledger(clock=cache.clock)
        # Multi-pod groups' domains, next to the reservations (one cluster-wide partition).
        self.groups = groups or GroupLedger(clock=self.ledger.clock)
        self.outcomes = GroupOutcomes()  # for /metrics: groups placed whole, split, waiting
        self.policy = policy
        self.keep_seconds = keep_seconds
        self._view_lock = threading.Lock()
        self._view: tuple[tuple[int, ...], float, float, Snapshot] | None = None
        # Plans the mutating webhook made whose validation has not come yet: key -> (until, allocation).
        self._plan_lock = threading.Lock()
        self._holds: dict[str, tuple[float, Allocation]] = {}
        self._holds_version = 0
        # The last commit's picture: ((cache generation, groups version), its entries by uid, the picture).
        self._last_commit: tuple[tuple[int, int], dict[str, Reservation], Snapshot] | None = None
        self.upkeep: Upkeep | None = None  # the watch and prune threads, when built by build_source
        self.elector: LeaseElector | None = None  # with --reservations leader: who decides (cluster/leader.py)

    def close(self) -> None:
        if self.elector is not None:
            self.elector.close()
        if self.upkeep is not None:
            self.upkeep.close()

    def leadership(self) -> Leadership | None:
        """Who decides, when replicas elect one decider; None: this replica decides alone."""
        return None if self.elector is None else self.elector.state()

    def reservation_count(self) -> int:
        """Admitted pods the watch has not shown yet (what the reservations hold)."""
        _, generation = self.cache.view()
        return sum(1 for e in self.ledger.active(self.horizon()) if not self.cache.counted(e.uid, generation))

    # -- plans between the two webhooks --------------------------------------------------------

    def plan(self, decide: Decide, key: str, dry_run: bool) -> Decision:
        """The mutating webhook's decision, one at a time, each seeing the GPUs the plans before it took:
        the pods of a burst are planned onto different cards, not all onto the same free one. A plan holds
        its node's GPUs (never quota) until its pod's validation (`release`) or HOLD_SECONDS."""
        with self._plan_lock:
            decision = decide(self.snapshot())
            allocation = decision.allocation
            if (key and not dry_run and decision.allowed and allocation is not None and allocation.node
                    and allocation.gpus and allocation.node in self.cache.view()[0].nodes):
                with self._view_lock:
                    self._holds[key] = (self.ledger.clock() + HOLD_SECONDS, allocation)
                    self._holds_version += 1
            return decision

    def release(self, key: str) -> None:
        """The plan `key` is decided on by validation: its reservation (if any) counts from now on."""
        with self._view_lock:
            if key and self._holds.pop(key, None) is not None:
                self._holds_version += 1

    def _with_holds(self, snapshot: Snapshot, now: float) -> tuple[Snapshot, float]:
        """`snapshot` with the node usage of the plans not yet validated (expired ones dropped), and when
        the first of them expires."""
        with self._view_lock:
            for key in [k for k, (until, _) in self._holds.items() if until <= now]:
                del self._holds[key]
                self._holds_version += 1
            holds = [a for _, a in self._holds.values()]
            first = min((until for until, _ in self._holds.values()), default=float("inf"))
        if not holds:
            return snapshot, first
        changed: dict[str, NodeUsage] = {}
        for allocation in holds:
            node = snapshot.nodes.get(allocation.node or "")
            if node is not None:
                changed[node.name] = add_to_node(node, changed.get(node.name) or snapshot.usage.get(
                    node.name, NodeUsage()), allocation)
        return with_usage(snapshot, changed), first

    def largest_written(self) -> int:
        """Bytes of the largest state object this replica wrote: a ledger ConfigMap's data
        (`--reservations api`, grows with in-flight admissions up to the 1 MiB object limit) or the
        decider's Lease (constant); 0 when it writes none."""
        stores = (self.ledger.store, self.groups.store, self.elector)
        return max((int(getattr(store, "largest_write", 0)) for store in stores), default=0)

    def can_lead(self) -> bool:
        """Whether this replica's picture is fit to decide from: synced and not stale."""
        return self.cache.synced() and self.cache.silence() <= self.policy().stale_after_seconds

    def reservation_conflicts(self) -> int:
        """Writes of the shared reservation store that lost to another replica (409) and were retried."""
        return self.ledger.store.conflicts

    # -- SnapshotSource -------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        base, generation = self.cache.view()
        key = (generation, self.ledger.store.version, self.groups.version, self._holds_version)
        horizon = self.horizon()
        view = self._view
        now = self.ledger.clock()
        if view is not None and view[0] == key and horizon < view[1] and now < view[2]:
            return view[3]
        entries = [e for e in self.ledger.active(horizon) if not self.cache.counted(e.uid, generation)]
        snapshot, first_hold = self._with_holds(self._with_groups(with_reservations(base, entries)), now)
        key = (generation, self.ledger.store.version, self.groups.version, self._holds_version)
        valid_until = min((e.expires_at for e in entries), default=float("inf"))
        with self._view_lock:
            self._view = (key, valid_until, first_hold, snapshot)
        return snapshot

    def fresh_snapshot(self, namespace: str) -> Snapshot:
        """`snapshot()` with the namespace's reservations read again where replicas share them: a
        ConfigMap write may come here a moment after another replica admitted a pod that reads it. When
        the ledger cannot be read, what this replica knows decides (logged)."""
        try:
            self.ledger.reread(namespace)
        except ReservationStoreError as error:
            log.warning("ConfigMap write in %s decided without other replicas' latest reservations: %s",
                        namespace, error)
        return self.snapshot()

    def ready(self) -> tuple[bool, str]:
        policy = self.policy()
        if not self.cache.synced():
            return False, f"watch cache not synced yet (waiting for: {', '.join(self.cache.unsynced())})"
        silent = self.cache.silence()
        if silent > policy.stale_after_seconds:
            return False, f"watch cache stale: no word from the API server for {silent:.0f}s"
        counts = self.cache.counts()
        role = ""
        lead = self.leadership()
        if lead is not None:
            if not lead.deciding and lead.peer is None:
                return False, lead.why_not()
            role = "; deciding" if lead.deciding else f"; forwarding to the decider {lead.holder}"
        return True, (
            f"watch cache synced: {counts['nodes']} nodes, {counts['pods']} GPU pods, "
            f"{len(self.ledger.active(self.horizon()))} reservations{role}"
        )

    def age_seconds(self) -> float:
        return self.cache.silence()

    def _commit_view(self, base: Snapshot, generation: int, entries: list[Reservation]) -> Snapshot:
        """The picture a commit decides against: `base` with `entries` folded in. Folded onto the previous
        commit's picture when that holds a subset of the same entries (a burst adds one at a time), so a
        namespace with thousands of admissions in flight costs each commit its new entries, not all."""
        current = {e.uid: e for e in entries}
        cached = self._last_commit
        groups_version = self.groups.version
        if cached is not None and cached[0] == (generation, groups_version) and all(
                current.get(uid) is entry for uid, entry in cached[1].items()):
            new = [e for uid, e in current.items() if uid not in cached[1]]
            view = with_reservations(cached[2], new) if new else cached[2]
        else:
            view = self._with_groups(with_reservations(base, entries))
        self._last_commit = ((generation, groups_version), current, view)
        return view

    def _with_groups(self, snapshot: Snapshot) -> Snapshot:
        records = self.groups.records()
        return replace(snapshot, groups=records) if records or snapshot.groups else snapshot

    def commit(
        self, uid: str, namespace: str, decide: Decide, dry_run: bool, group: GroupRef | None = None,
        pod: Mapping[str, Any] | None = None,
    ) -> Decision:
        """`group`: the pod's group (core/groups.py), whose record is written with its reservation.
        `pod`: the pod itself, whose envFrom reads the reservation keeps (read before the store's lock)."""
        refusal = self._refusal(self.policy())
        if refusal is not None:
            return refusal
        joined: list[str] = []  # the group record this pod was written into, to undo if not admitted
        weighed: list[tuple[int, int, bool]] = []  # (room, needs, first member) of the last group commit
        views: list[Snapshot] = []  # the pictures decided against

        def decide_with(entries: Entries) -> Decision:
            base, generation = self.cache.view()
            pending = [e for e in entries if not self.cache.counted(e.uid, generation)]
            others = [
                e
                for e in self.ledger.active(self.horizon())
                if e.namespace != namespace and e.uid != uid and not self.cache.counted(e.uid, generation)
            ]
            view = self._commit_view(base, generation, pending + others)
            decision = decide(view)
            views.append(view)
            allocation = decision.allocation
            if (group is None or dry_run or not uid or not decision.allowed or allocation is None
                    or not allocation.group or not allocation.domain):
                return decision
            domain = allocation.domain
            shown = {e.uid for e in pending} | {e.uid for e in others}
            # The size its controller's object states, when the pod states none (the watched owners).
            ref = sized(group, view.group_sizes) if view.group_sizes else group

            def free(records: Mapping[str, Any]) -> int:
                room = domain_free(view, domain) - unseen_members(
                    records, domain, ref.key, lambda m: m in shown or self.cache.counted(m, generation))
                needs = (ref.size or ref.minimum) * allocation.gpu_count
                weighed.append((room, needs, False))
                return room

            # Inside the reservation's transaction: refused here, the pod reserves nothing either.
            room = gpu_room(namespace, view)  # the view counts every reservation but this pod's
            outcome = self.groups.commit(ref, allocation, uid, free=free,
                                         quota_room=None if room is None else room - allocation.gpu_count)
            if isinstance(outcome, str):
                return denied(403, REFUSAL_REASON, refusal_message(ref, outcome), warnings=decision.warnings)
            joined.append(outcome.key)
            if weighed:  # the record has only this pod: it was just made (or made by this pod's retry)
                weighed[-1] = (*weighed[-1][:2], outcome.members == (uid,))
            return decision

        reads = env_reads(pod, True) if pod is not None and not dry_run else None  # reserved: it holds GPUs
        try:
            decision = self.ledger.commit(
                uid, namespace, decide_with, dry_run, horizon=self.horizon, droppable=self.droppable,
                reads=None if reads is None else lambda: reads,
            )
            if joined and not decision.allowed:  # decided again after a lost write, and refused then
                self.groups.forget(joined[-1], uid)
            if not dry_run:
                self._count_group(group, decision, weighed, views[-1] if views else None)
            return decision
        except ReservationStoreError as error:
            if joined:
                self._forget(joined[-1], uid)
            log.error("admission of pod %s in %s not recorded: %s", uid, namespace, error)
            return denied(503, "reservation-failed",
                          f"GPU admission could not record the pod's reservation ({error}); retry")

    # -- upkeep ---------------------------------------------------------------------------------

    def horizon(self) -> float:
        """Ledger time up to which reservations may be judged expired: when the pod watch last heard
        from the server. A pod created before then would have been seen; while the watch is silent,
        reservations keep counting past their TTL."""
        return self.ledger.clock() - self.cache.silence("pods")

    def droppable(self, entry: Reservation) -> bool:
        """True when an entry can leave the store: expired, or its pod seen, `keep_seconds` ago."""
        if entry.expires_at + self.keep_seconds <= self.horizon():
            return True
        seen = self.cache.seen_at(entry.uid)
        return seen is not None and self.cache.clock() - seen >= self.keep_seconds

    def _count_group(self, group: GroupRef | None, decision: Decision, weighed: list[tuple[int, int, bool]],
                     view: Snapshot | None) -> None:
        if group is None:
            return
        allocation = decision.allocation
        if decision.reason == REFUSAL_REASON:
            self.outcomes.count("waiting", group.key)
        elif decision.allowed and allocation is not None and allocation.group:
            if not allocation.domain:  # split, where there were domains to keep it in
                if view is not None and has_domains(view, self.policy().group_levels):
                    self.outcomes.placed(group.key, "", 0, 0, False)
            elif weighed:
                self.outcomes.placed(group.key, allocation.domain, *weighed[-1])

    def group_outcomes(self) -> dict[str, int]:
        """Groups placed whole, split and waiting since this process started (for /metrics)."""
        return dict(self.outcomes.counts)

    def _forget(self, key: str, uid: str) -> None:
        try:
            self.groups.forget(key, uid)
        except ReservationStoreError as error:  # the record then expires with its pods
            log.warning("group %s keeps pod %s it did not admit: %s", key, uid, error)

    def prune(self) -> int:
        """Delete finished reservations from the store, and group records whose pods are gone
        (called periodically)."""
        dropped = self.ledger.prune(self.droppable)
        reserved = {e.uid for e in self.ledger.active(self.horizon())}

        def alive(uid: str) -> bool:  # the watch has its pod, or its reservation counts (pod not seen yet)
            return self.cache.present(uid) or (uid in reserved and self.cache.seen_at(uid) is None)

        self.groups.refresh()
        self.groups.prune(alive, self.cache.gone)
        return dropped

    def _refusal(self, policy: Policy) -> Decision | None:
        if not self.cache.synced():
            return denied(503, "not-synced",
                          "GPU admission is starting: the cluster state is not loaded yet; retry shortly")
        silent = self.cache.silence()
        limit = policy.stale_after_seconds + policy.stale_grace_seconds
        if silent > limit and policy.on_stale == "deny":
            return denied(503, "stale", f"GPU admission cannot check quotas: no word from the API server for "
                f"{silent:.0f}s (limit {limit:.0f}s); retry later")
        return None


def build_source(
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    in_cluster: bool = False,
    namespace: str = "gpu-admission",
    policy_file: str | None = None,
    policy: PolicyHolder | None = None,
    reservations: str | None = None,
    ledger_budget_seconds: float = 3.5,
    start: bool = True,
    freeze_gc: bool = True,
    peer_url: str | None = None,
    identity: str | None = None,
    takeover_wait: float = 5.0,
) -> LiveSource:
    """A LiveSource watching the cluster (started unless `start` is False).

    `ledger_budget_seconds`: how long one admission may spend writing the shared ledger (keep it under the
    webhooks' timeoutSeconds). `reservations`: "memory" (in-process; one replica, the default) or "api" (ConfigMaps in
    `namespace`, shared by two or more replicas); None reads $GPU_ADMISSION_RESERVATIONS. `policy`: the
    process's holder, shared with the server (`serve` passes it); None makes one for `policy_file`.
    """
    import os

    from webhook.errors import UserError

    from .cache import KINDS, POOL_KINDS, SIZE_KINDS
    from .config import load_api_client
    from .group_ledger import GroupApiStore
    from .kube import KubeLister
    from .reservations import ApiStore, InProcessStore, ReservationStore, TimedConfigMaps
    from .watch import Reflector

    kind = reservations or os.environ.get("GPU_ADMISSION_RESERVATIONS") or "memory"
    if kind not in ("memory", "api", "leader"):
        raise UserError(f"reservations must be memory, api or leader, got {kind!r}")
    if kind == "leader" and not peer_url:
        raise UserError("reservations leader needs the address other replicas reach this one at (--peer-url)")
    api_client = load_api_client(kubeconfig, context, in_cluster_only=in_cluster and kubeconfig is None)
    holder = policy or PolicyHolder(policy_file)
    current: Policy = holder.get()
    store: ReservationStore
    group_store: ReservationStore
    if kind == "api":
        from kubernetes import client

        keep = current.stale_after_seconds + current.stale_grace_seconds
        core_api = TimedConfigMaps(client.CoreV1Api(api_client))
        store = ApiStore(core_api, namespace, budget_seconds=ledger_budget_seconds)
        group_store = GroupApiStore(core_api, namespace, budget_seconds=ledger_budget_seconds)
    else:  # memory, or leader: the elected decider keeps them in its process
        store, group_store, keep = InProcessStore(), InProcessStore(), 0.0
    cache = ClusterCache(dra_classes=lambda: holder.get().dra_device_classes)
    # A group keeps its domain while its controller re-creates a pod: longer than any reservation counts.
    grace = max(300.0, current.reservation_ttl_seconds + keep)
    source = LiveSource(cache, Ledger(store, ttl_seconds=current.reservation_ttl_seconds), holder.get,
                        keep_seconds=keep, groups=GroupLedger(group_store, grace_seconds=grace))
    if kind == "leader":
        import secrets
        import socket

        from .leader import KubeLeases

        name = identity or f"{os.environ.get('POD_NAME') or socket.gethostname()}-{secrets.token_hex(3)}"
        source.elector = LeaseElector(KubeLeases(api_client, namespace), name, str(peer_url),
                                      takeover_wait=takeover_wait, eligible=source.can_lead)
    lister = KubeLister(api_client)
    watch_timeout = int(max(10.0, min(60.0, current.stale_after_seconds / 2)))
    reflectors = [Reflector(k, lister.list_pages, lister.stream, cache, watch_timeout=watch_timeout)
                  for k in (*KINDS, *SIZE_KINDS, *POOL_KINDS)]
    source.upkeep = Upkeep(source, reflectors, freeze_gc=freeze_gc)
    lister.stop = source.upkeep.stop  # an absent API's wait for its next look ends when the watches close
    if start:
        source.upkeep.start()
        if source.elector is not None:
            source.elector.start()
    return source
