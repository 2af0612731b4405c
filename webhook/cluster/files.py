"""Cluster state from files (`check --cluster`, a static webhook source) and the embedded demo cluster.

Each object is checked as it is read, so a bad inventory or quota is reported with its file, document
and field instead of surfacing later as a wrong decision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from importlib import resources
from typing import Any

from webhook.core.domain.model import Claim, Snapshot
from webhook.errors import UserError
from webhook.manifests import EXTENSIONS, Document, expand_paths, load_documents, parse_text

from .nodepools import POOL_KIND_NAMES
from .translate import CLUSTER_KINDS, claim_of, config_map_of, inventory_of, namespace_of, node_of, quotas_of

DEMO_RESOURCE = "demo/cluster.yaml"


def _check_inventory(obj: Mapping[str, Any]) -> object:
    return inventory_of(obj.get("spec"))


_CHECKS: Mapping[str, Callable[[Mapping[str, Any]], object]] = {
    "Node": node_of,
    "GPUInventory": _check_inventory,
    "Namespace": namespace_of,
    "ResourceQuota": quotas_of,
    "ResourceClaim": claim_of,
    "ResourceClaimTemplate": claim_of,
    "ConfigMap": config_map_of,  # read by envFrom: only the keys that can set a device or limit variable
}


def cluster_objects(documents: Sequence[Document]) -> list[dict[str, Any]]:
    """The cluster kinds among `documents`, each checked; other kinds are dropped."""
    objects: list[dict[str, Any]] = []
    for doc in documents:
        kind = doc.data.get("kind")
        if kind not in CLUSTER_KINDS:
            continue
        check = _CHECKS.get(str(kind))
        if check is not None:
            try:
                check(doc.data)
            except ValueError as err:
                message = str(err)
                path, sep, detail = message.partition(": ")
                if sep and " " not in path:
                    raise doc.error(path, detail) from None
                raise doc.error("", message) from None
        objects.append(dict(doc.data))
    return objects


def load_cluster(paths: Sequence[str]) -> list[dict[str, Any]]:
    """Node, Namespace, ResourceQuota, Pod, GPUInventory and DRA ResourceClaim(Template) objects from files
    or directories.

    Raises UserError naming the file, document and field of the first object that is malformed.
    """
    return cluster_objects(load_documents(paths))


HOW_TO_WRITE = (
    "write one with `gpu-admission snapshot -o cluster.yaml`, or "
    "`kubectl get nodes,namespaces,resourcequotas -o yaml > cluster.yaml`"
)


def read_cluster(paths: Sequence[str], need_namespaces: bool = True) -> list[dict[str, Any]]:
    """`load_cluster` for input that must be a cluster (`check --cluster`): an empty directory, a document
    that is no Kubernetes object (a docker-compose file, Helm values), files without a Node, or without a
    Namespace when `need_namespaces`, are a UserError naming the file and what is missing, instead of a
    cluster in which no pod is ever managed."""
    for path in paths:
        if not any(True for _ in expand_paths([path])):
            raise UserError(
                f"--cluster {path}: no {', '.join('*' + e for e in EXTENSIONS)} files in this directory; {HOW_TO_WRITE}"
            )
    documents = load_documents(paths)
    for doc in documents:
        kind = doc.data.get("kind")
        if not isinstance(kind, str) or not kind:
            what = "no kind" if kind is None else f"kind is {kind!r}, not a name"
            raise doc.error(
                "kind",
                f"{what}: this is not a Kubernetes object; --cluster reads Node, Namespace, "
                f"ResourceQuota, Pod and GPUInventory objects ({HOW_TO_WRITE})",
            )
    objects = cluster_objects(documents)
    files = ", ".join(paths)
    found = sorted({str(doc.data["kind"]) for doc in documents})
    seen = f"found only {', '.join(found)}" if found else "found no objects"
    kinds = {obj.get("kind") for obj in objects}
    if "Node" not in kinds and not kinds & POOL_KIND_NAMES:  # a cluster that scales from zero has pools only
        raise UserError(
            f"--cluster {files}: no Node objects ({seen}): without them (or NodePools and node groups that "
            f"scale from zero) no pod can be placed; {HOW_TO_WRITE}"
        )
    if need_namespaces and "Namespace" not in kinds:
        raise UserError(
            f"--cluster {files}: no Namespace objects: without them no namespace is managed and every "
            "pod is let through unchanged; add the Namespaces (labelled gpu-admission.io/enabled: "
            '"true" where the webhook manages pods), or set managedNamespaces: all in --policy'
        )
    return objects


def demo_objects() -> list[dict[str, Any]]:
    """The demo cluster shipped in the package (H100 NVSwitch, A100 NVLink pairs, L4/T4, CPU-only nodes)."""
    try:
        text = resources.files("webhook").joinpath(DEMO_RESOURCE).read_text(encoding="utf-8")
    except OSError as err:  # a broken installation, not a user mistake
        raise UserError(f"the demo cluster is missing from the installed package: {err}") from None
    return cluster_objects(parse_text(text, "webhook/" + DEMO_RESOURCE))


def with_manifest_claims(snapshot: Snapshot, documents: Sequence[Any], default_namespace: str) -> Snapshot:
    """`snapshot` with the ResourceClaims and ResourceClaimTemplates written next to the workloads being
    checked (a JobSet and its claim template in one file), in the namespace their pods get. A claim that
    cannot be read is a DocumentError naming its file, document and field."""
    found: dict[str, dict[str, Claim]] = {"ResourceClaim": {}, "ResourceClaimTemplate": {}}
    for doc in documents:
        data = getattr(doc, "data", None)
        if not isinstance(data, Mapping) or data.get("kind") not in found:
            continue
        metadata = data.get("metadata") if isinstance(data.get("metadata"), Mapping) else {}
        placed = {**data, "metadata": {**metadata, "namespace": metadata.get("namespace") or default_namespace}}
        try:
            key, claim = claim_of(placed)
        except ValueError as err:
            path, _, detail = str(err).partition(": ")
            raise doc.error(path, detail) from None
        found[str(data["kind"])][key] = claim
    if not found["ResourceClaim"] and not found["ResourceClaimTemplate"]:
        return snapshot
    return replace(
        snapshot,
        claims={**snapshot.claims, **found["ResourceClaim"]},
        claim_templates={**snapshot.claim_templates, **found["ResourceClaimTemplate"]},
    )


def with_manifest_config_maps(snapshot: Snapshot, documents: Sequence[Any], default_namespace: str) -> Snapshot:
    """`snapshot` with the ConfigMaps written next to the workloads being checked (a Deployment and the
    ConfigMap its envFrom reads, in one file), in the namespace their pods get, reduced as the watch cache
    reduces them. A ConfigMap that cannot be read is a DocumentError naming its file, document and field."""
    found: dict[str, dict[str, frozenset[str]]] = {}
    for doc in documents:
        data = getattr(doc, "data", None)
        if not isinstance(data, Mapping) or data.get("kind") != "ConfigMap":
            continue
        metadata = data.get("metadata") if isinstance(data.get("metadata"), Mapping) else {}
        placed = {**data, "metadata": {**metadata, "namespace": metadata.get("namespace") or default_namespace}}
        try:
            namespace, name, keys = config_map_of(placed)
        except ValueError as err:
            path, _, detail = str(err).partition(": ")
            raise doc.error(path, detail) from None
        found.setdefault(namespace, {})[name] = keys
    if not found:
        return snapshot
    merged = {ns: {**snapshot.config_maps.get(ns, {}), **maps} for ns, maps in found.items()}
    return replace(snapshot, config_maps={**snapshot.config_maps, **merged})
