"""Reading `gpu-admission check`'s inputs: the policy, the cluster state and the manifests to decide.

The cluster comes from --cluster files, a live cluster (--kubeconfig) or the embedded demo, with the
groups the webhook's ledger already placed. The manifests are expanded from files, directories or
stdin; a document without a kind is an input error, not an object. What the manifests bring that the
webhook would see in the cluster once they are applied is counted in the snapshot first: their DRA
claims and claim templates, the ConfigMaps their envFrom reads, the group sizes their controllers state.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple


class Inputs(NamedTuple):
    files: list[str]  # the manifest files read
    policy: Any
    snapshot: Any  # the cluster, with what the manifests bring
    documents: list[Any]  # manifests.Document, or Problem for one that could not be read


def read_inputs(args: argparse.Namespace) -> Inputs:
    """What `check` decides and against what; a UserError names the input to fix."""
    from webhook.cluster.files import with_manifest_claims, with_manifest_config_maps
    from webhook.cluster.translate import build_snapshot
    from webhook.errors import UserError
    from webhook.manifests import STDIN, Document, expand_paths, read_all
    from webhook.policyfile.read import load_policy

    files = list(expand_paths(args.paths))
    empty = [p for p in args.paths if p != STDIN and not any(True for _ in expand_paths([p]))]
    if empty:
        raise UserError(f"{empty[0]}: no manifests in this directory (*.yaml, *.yml, *.json)")
    policy = load_policy(args.policy)
    objects = _cluster_objects(args, policy)
    try:
        snapshot = build_snapshot(objects, dra_classes=policy.dra_device_classes)
    except ValueError as err:
        raise UserError(f"invalid cluster state: {err}") from None
    snapshot = _with_live_groups(snapshot, objects)
    documents = _no_kind_problems(read_all(args.paths, stdin=sys.stdin))
    if not documents:
        raise UserError(f"{', '.join(args.paths)}: no Kubernetes objects to check (the files are empty)")
    # DRA claims and claim templates written next to the workloads count as if they existed already.
    manifests = [doc for doc in documents if isinstance(doc, Document)]
    snapshot = with_manifest_claims(snapshot, manifests, args.namespace)
    snapshot = with_manifest_config_maps(snapshot, manifests, args.namespace)  # what their envFrom reads
    snapshot = _with_manifest_group_sizes(snapshot, manifests, args.namespace)  # a PyTorchJob sizes its pods' group
    return Inputs(files, policy, snapshot, documents)


def _cluster_objects(args: argparse.Namespace, policy: Any) -> list[dict[str, Any]]:
    from webhook.cluster.files import demo_objects, read_cluster

    if args.kubeconfig:
        from .snapshot import live_objects

        return list(live_objects(args.kubeconfig, args.context))
    if args.cluster:
        return list(read_cluster(args.cluster, need_namespaces=policy.managed_namespaces != "all"))
    return list(demo_objects())


def _with_live_groups(snapshot: Any, objects: list[dict[str, Any]]) -> Any:
    """The groups the webhook's ledger already placed (its `gpu-admission-groups` ConfigMap, listed with
    `--kubeconfig` or written in a --cluster file): their pods follow their domains here too."""
    from dataclasses import replace

    from webhook.cluster.group_ledger import records_in

    records = records_in(objects)
    return replace(snapshot, groups={**snapshot.groups, **records}) if records else snapshot


def _with_manifest_group_sizes(snapshot: Any, manifests: Sequence[Any], namespace: str) -> Any:
    """The group sizes the checked manifests' own controllers state (a PyTorchJob's replica specs, a
    PodGroup's minMember), as the watch reads them from the cluster once they are applied."""
    from dataclasses import replace

    from webhook.core.placement.groups import merge_sizes, sizes_of

    tables = []
    for doc in manifests:
        data = doc.data if isinstance(doc.data, dict) else {}
        metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        if not metadata.get("namespace"):
            data = {**data, "metadata": {**metadata, "namespace": namespace}}
        tables.append(sizes_of(data))
    found = merge_sizes(tables)
    return replace(snapshot, group_sizes=merge_sizes([snapshot.group_sizes, found])) if found else snapshot


def _no_kind_problems(documents: list[Any]) -> list[Any]:
    """A document without a kind is no Kubernetes object (a docker-compose file, Helm values): an input
    error naming its file and document, not an object to walk for pod templates."""
    from webhook.manifests import Document, Problem

    out: list[Any] = []
    for doc in documents:
        kind = doc.data.get("kind") if isinstance(doc, Document) else "-"
        if isinstance(kind, str) and kind:
            out.append(doc)
            continue
        what = "no kind" if kind is None else f"kind is {kind!r}, not a name"
        message = f"{what}: not a Kubernetes object (every object states apiVersion and kind)"
        error = doc.error("kind", message)
        metadata = doc.data.get("metadata") if isinstance(doc.data.get("metadata"), Mapping) else {}
        name = metadata.get("name") if isinstance(metadata.get("name"), str) else ""
        out.append(Problem(doc.source, error.field, message, str(error), name=name, index=doc.index))
    return out
