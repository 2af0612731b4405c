"""The watch cache's DRA bookkeeping: ResourceClaims, ResourceClaimTemplates and the pods that hold claims.

Of a claim only what counting needs is kept (its device requests, who holds it), so status churn
(allocation results, conditions) that changes none of it publishes nothing. A pod naming claims is
remembered with its claim references: on publish the GPUs of the claims it holds (each claim once, read
with the policy's GPU device classes) are added to its namespace's usage, and the claims' users are
counted (`Snapshot.claim_users`). A change of the policy's device classes counts the holders again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from webhook.core.admission.dra import claim_users, held_usage, largest_card
from webhook.core.domain.model import Claim, Node, Snapshot, Usage

CLAIM_KINDS = ("resourceclaims", "resourceclaimtemplates")
CLAIM_ITEM_KINDS = {"resourceclaims": "ResourceClaim", "resourceclaimtemplates": "ResourceClaimTemplate"}

ClaimRefs = tuple[tuple[str, str], ...]


class ClaimTables:
    """Claims and claim templates by "ns/name", and the pods holding claims."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Claim]] = {kind: {} for kind in CLAIM_KINDS}  # "ns/name" -> Claim
        # Pods holding DRA claims: pod key -> (namespace, claim refs); their GPUs count with the claims'.
        self.holders: dict[str, tuple[str, ClaimRefs]] = {}
        self._held_classes: tuple[str, ...] = ()
        # what changed since the last publish: a kind of CLAIM_KINDS, "claim_users", "namespace_usage"
        self.changed: set[str] = set()

    def put(self, kind: str, key: str, claim: Claim | None) -> None:
        """Keep claim `key` of `kind` as it is now (None: unreadable or gone)."""
        table = self.claims[kind]
        if claim is None:
            if table.pop(key, None) is not None:
                self.changed.update((kind, "namespace_usage"))
        elif table.get(key) != claim:
            table[key] = claim
            self.changed.update((kind, "namespace_usage"))

    def hold(self, key: str, namespace: str, refs: ClaimRefs) -> None:
        """Pod `key` of `namespace` names the claims `refs` now (none: it holds no claim)."""
        if refs != self.holders.get(key, ("", ()))[1]:
            if refs:
                self.holders[key] = (namespace, refs)
            else:
                del self.holders[key]
            self.changed.update(("namespace_usage", "claim_users"))

    def release(self, key: str) -> None:
        """Pod `key` is gone."""
        if self.holders.pop(key, None) is not None:
            self.changed.update(("namespace_usage", "claim_users"))

    def check_classes(self, classes: Callable[[], tuple[str, ...]]) -> None:
        """When some pod holds a claim and the policy's GPU device classes (read only then) changed,
        the holders count again."""
        if self.holders and classes() != self._held_classes:
            self.changed.add("namespace_usage")

    def usage_changed(self) -> bool:
        """Whether namespace usage is to be counted again for the claims (since the last publish)."""
        return "namespace_usage" in self.changed

    def counts_again(self, recount: bool, classes: tuple[str, ...]) -> bool:
        """Whether the held claims' GPUs are added up again: some pod holds a claim, and namespace usage
        or the nodes changed (`recount`), or the policy's device classes did."""
        return bool(self.holders) and (recount or classes != self._held_classes)

    def add_held(self, ns_usage: dict[str, Usage], nodes: Mapping[str, Node],
                 classes: tuple[str, ...]) -> dict[str, Usage]:
        """`ns_usage` (each namespace's pods) with the GPUs of the claims their pods hold added."""
        self._held_classes = classes
        held = held_usage(self.holders, self.claims["resourceclaims"], self.claims["resourceclaimtemplates"],
                          largest_card(nodes), classes)
        for namespace, use in held.items():
            ns_usage[namespace] = ns_usage.get(namespace, Usage()) + use
        return ns_usage

    def published(self, previous: Snapshot | None) -> tuple[Mapping[str, Claim], Mapping[str, Claim],
                                                             Mapping[str, Mapping[tuple[str, str], int]]]:
        """The snapshot's claims, claim templates and claim users, sharing what did not change."""
        changed, self.changed = self.changed, set()
        users = claim_users(self.holders) if "claim_users" in changed or previous is None else previous.claim_users
        claims, templates = (
            dict(self.claims[kind]) if kind in changed or previous is None else getattr(previous, field)
            for kind, field in zip(CLAIM_KINDS, ("claims", "claim_templates"), strict=True)
        )
        return claims, templates, users
