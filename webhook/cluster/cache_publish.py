"""Publishing the watch cache's Snapshot: copy-on-write, by what changed since the previous one.

A snapshot is published only after something changed, and it shares with the previous one every
mapping that did not change: the nodes unless a Node or GPUInventory changed, the node usage updated by
the nodes whose usage changed (and the placement index carried over, `placement.state.carry_index`),
namespaces, quotas and namespace usage only when theirs did, and likewise the claims, ConfigMaps,
envFrom readers, group sizes and scale pools each part of the cache keeps. The result equals
`translate.build_snapshot` over the same objects.
"""

from __future__ import annotations

from collections.abc import Mapping

from webhook.core.domain.model import Namespace, Node, NodeUsage, QuotaLimits, Snapshot, Usage
from webhook.core.placement.state import carry_index

from .cache_claims import ClaimTables
from .cache_envfrom import EnvFromTables
from .cache_optional import OptionalKinds
from .cache_usage import UsageBook


def publish(previous: Snapshot | None, *, nodes_changed: bool, sections: set[str], nodes: Mapping[str, Node],
            namespaces: Mapping[str, Namespace], quotas: Mapping[str, Mapping[str, QuotaLimits]],
            book: UsageBook, claims: ClaimTables, env: EnvFromTables, optional: OptionalKinds,
            classes: tuple[str, ...]) -> Snapshot:
    """The snapshot after `previous` (None: the first). `sections` names what changed of the cache's own
    tables ("namespaces", "quotas"); its parts say what changed of theirs, and are told it is published."""
    published_nodes, usage, changed = _nodes_and_usage(previous, nodes_changed, nodes, book)
    published_namespaces = dict(namespaces) if "namespaces" in sections or previous is None else previous.namespaces
    published_quotas: Mapping[str, tuple[QuotaLimits, ...]] = (
        {ns: tuple(sorted(qs.values(), key=lambda q: q.name)) for ns, qs in quotas.items()}
        if "quotas" in sections or previous is None
        else previous.quotas
    )
    ns_usage = _namespace_usage(previous, nodes_changed, nodes, book, claims, classes)
    claim_map, templates, users = claims.published(previous)
    config_maps, env_readers = env.published(previous)
    group_sizes, pools = optional.published(previous, nodes.values(), nodes_changed)
    snapshot = Snapshot(published_nodes, usage, published_namespaces, published_quotas, ns_usage, claims=claim_map,
                        claim_templates=templates, claim_users=users, config_maps=config_maps,
                        env_readers=env_readers, group_sizes=group_sizes, scale_pools=pools,
                        observed=book.observed.view())
    if previous is not None:
        carry_index(previous, snapshot, changed)  # copy-on-write, by the nodes whose usage changed
    return snapshot


def _nodes_and_usage(previous: Snapshot | None, nodes_changed: bool, nodes: Mapping[str, Node], book: UsageBook,
                     ) -> tuple[Mapping[str, Node], Mapping[str, NodeUsage], dict[str, NodeUsage]]:
    """The nodes, their usage, and the usage that changed while the nodes did not (empty otherwise)."""
    changed: dict[str, NodeUsage] = {}
    if previous is None or nodes_changed:
        published: Mapping[str, Node] = dict(nodes)
        usage: Mapping[str, NodeUsage] = dict(book.usage)  # one entry per node, kept in step
    else:
        published = previous.nodes
        if book.changed:
            changed = {n: book.usage[n] for n in book.changed if n in nodes}
            usage = {**previous.usage, **changed}
        else:
            usage = previous.usage
    book.changed = set()
    return published, usage, changed


def _namespace_usage(previous: Snapshot | None, nodes_changed: bool, nodes: Mapping[str, Node], book: UsageBook,
                     claims: ClaimTables, classes: tuple[str, ...]) -> Mapping[str, Usage]:
    """Each namespace's GPU usage: its pods', and the GPUs of the DRA claims they hold."""
    recount = previous is None or book.namespaces_changed or claims.usage_changed()
    book.namespaces_changed = False
    ns_usage: Mapping[str, Usage] = (
        book.namespace_usage() if recount or previous is None else previous.namespace_usage
    )
    if claims.counts_again(recount or nodes_changed, classes):
        ns_usage = claims.add_held(book.namespace_usage(), nodes, classes)
    return ns_usage
