"""Admission of GPUInventory writes: a node's agent may write its own inventory and nothing else.

The agent runs on every GPU node, so its credentials are the easiest in the cluster to steal. RBAC can
only say "may write gpuinventories"; a token bound to a node (Kubernetes 1.30+ puts the node's name in
`userInfo.extra["authentication.kubernetes.io/node-name"]`) lets this guard narrow that to the one
object named after the node, so a compromised node cannot misdescribe the GPUs of any other node.
Every CREATE and UPDATE is also held to the inventory format, whoever writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.domain.decision import Decision, allowed, denied
from webhook.core.domain.names import GROUP
from webhook.core.podspec.inventory import InventoryError, check_inventory

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
INVENTORY_GROUP = GROUP
INVENTORY_RESOURCE = "gpuinventories"
GUARDED_OPERATIONS = ("CREATE", "UPDATE", "DELETE")


def is_inventory_request(request: Mapping[str, Any]) -> bool:
    """True when the AdmissionRequest is about a GPUInventory object (and not a subresource)."""
    resource = request.get("resource")
    if not isinstance(resource, Mapping):
        return False
    return (
        resource.get("group") == INVENTORY_GROUP
        and resource.get("resource") == INVENTORY_RESOURCE
        and not request.get("subResource")
    )


def check_inventory_write(request: Mapping[str, Any]) -> Decision:
    """Decide a GPUInventory CREATE, UPDATE or DELETE.

    403 when a node-bound writer touches another node's inventory; 422 when the spec breaks the format;
    allowed otherwise (requests about other resources are not this guard's business and are allowed).
    """
    if not is_inventory_request(request):
        return _allowed()
    operation = request.get("operation")
    if operation not in GUARDED_OPERATIONS:
        return _allowed()
    obj = request.get("object") if operation != "DELETE" else request.get("oldObject")
    name = _object_name(request, obj)

    bound = _bound_nodes(request)
    if len(bound) > 1:
        return _denied(
            403,
            "inventory-node-mismatch",
            f"GPUInventory {name!r}: the writer's token names several nodes ({', '.join(bound)})",
        )
    if bound and name != bound[0]:
        shown = repr(name) if name else "without a name"
        return _denied(
            403,
            "inventory-node-mismatch",
            f"GPUInventory {shown}: a token bound to node {bound[0]!r} may only write "
            f"the GPUInventory named {bound[0]!r}",
        )

    if operation == "DELETE":
        return _allowed()
    if not isinstance(obj, Mapping):
        return _denied(422, "invalid-inventory", f"GPUInventory {name!r}: the request carries no object")
    if "spec" not in obj:
        return _denied(422, "invalid-inventory", f"GPUInventory {name!r}: spec: required")
    try:
        check_inventory(obj["spec"], "spec")
    except InventoryError as err:
        return _denied(422, "invalid-inventory", f"GPUInventory {name!r}: {err}")
    return _allowed()


def _bound_nodes(request: Mapping[str, Any]) -> list[str]:
    """The node names the writer's token is bound to (usually none or one)."""
    user = request.get("userInfo")
    if not isinstance(user, Mapping):
        return []
    extra = user.get("extra")
    if not isinstance(extra, Mapping):
        return []
    values = extra.get(NODE_NAME_EXTRA)
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list | tuple):
        return []
    names: list[str] = []
    for value in values:
        if isinstance(value, str) and value and value not in names:
            names.append(value)
    return names


def _object_name(request: Mapping[str, Any], obj: Any) -> str:
    name = request.get("name")
    if isinstance(name, str) and name:
        return name
    if isinstance(obj, Mapping):
        metadata = obj.get("metadata")
        if isinstance(metadata, Mapping):
            value = metadata.get("name")
            if isinstance(value, str):
                return value
    return ""


def _allowed() -> Decision:
    return allowed(gpu_pod=False)


def _denied(code: int, reason: str, message: str) -> Decision:
    return denied(code, reason, message, gpu_pod=False)
