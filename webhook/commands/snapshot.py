"""`gpu-admission snapshot`: save the live cluster objects that `check --cluster FILE` decides against.

Nodes, Pods, Namespaces, ResourceQuotas, GPUInventories and DRA ResourceClaims(Templates), as one
`kind: List` YAML document, without `metadata.managedFields` (bookkeeping of the API server that no
reader needs).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from webhook.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig file (default: in-cluster, $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current one)")
    parser.add_argument(
        "-o", "--output", metavar="FILE", required=True, help="where to write the List YAML ('-': stdout)"
    )


def run(args: argparse.Namespace) -> int:
    objects = live_objects(args.kubeconfig, args.context)
    text = to_list_yaml(objects)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        try:
            with open(args.output, "w", encoding="utf-8") as out:
                out.write(text)
        except OSError as err:
            raise UserError(f"{args.output}: cannot write: {err.strerror or err}") from None
        counts: dict[str, int] = {}
        for obj in objects:
            counts[str(obj.get("kind"))] = counts.get(str(obj.get("kind")), 0) + 1
        summary = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "no objects"
        print(f"wrote {args.output}: {summary}", file=sys.stderr)
    return 0


def strip(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object without `metadata.managedFields`; a ConfigMap with only the keys the webhook reads
    (those that envFrom could turn into a device or limit variable), values blanked: no configuration
    data leaves the cluster in a snapshot."""
    out = dict(obj)
    if out.get("kind") == "ConfigMap":
        from webhook.core.admission.envfrom import env_from_keys

        out.pop("binaryData", None)
        out["data"] = {key: "" for key in sorted(env_from_keys(out.get("data")))}
    metadata = out.get("metadata")
    if isinstance(metadata, Mapping) and "managedFields" in metadata:
        out["metadata"] = {k: v for k, v in metadata.items() if k != "managedFields"}
    return out


def to_list_yaml(objects: Iterable[Mapping[str, Any]]) -> str:
    import yaml

    document = {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": [strip(o) for o in objects]}
    return str(yaml.safe_dump(document, sort_keys=False, default_flow_style=False))


def live_objects(kubeconfig: str | None, context: str | None = None) -> list[dict[str, Any]]:
    """Every Node, Pod, Namespace, ResourceQuota and GPUInventory of the cluster, managedFields stripped.

    UserError (one line) when the kubeconfig is wrong, the API server cannot be reached or refuses.
    A cluster without the GPUInventory CRD simply has none.
    """
    from webhook.cluster.config import load_api_client
    from webhook.cluster.kube import KINDS, OPTIONAL, KubeLister
    from webhook.cluster.watch import status_code

    api_client = load_api_client(kubeconfig, context)
    host = getattr(api_client.configuration, "host", "the API server")
    lister = KubeLister(api_client)
    objects: list[dict[str, Any]] = []
    for kind in KINDS:
        try:
            for page in lister.list_pages(kind):
                objects.extend(strip(item) for item in page.get("items") or ())
        except Exception as error:
            code = status_code(error)
            if code == 404 and kind in OPTIONAL:
                continue  # no CRD (GPUs come from node labels) or no resource.k8s.io/v1 (no DRA claims)
            if code is not None:
                reason = getattr(error, "reason", "") or ""
                raise UserError(f"{host}: cannot list {kind}: HTTP {code} {reason}".rstrip()) from None
            raise UserError(f"{host}: cannot list {kind}: {_short(error)}") from None
    return objects


def _short(error: BaseException) -> str:
    reason = getattr(error, "reason", None)  # urllib3's MaxRetryError: the underlying connection error
    text = str(reason if reason is not None else error).splitlines()[0] or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."
