"""Publishing the inventory as the node's GPUInventory object, and nothing else.

The agent's only API rights are get/create/update on `gpuinventories`: it never touches Nodes, because a
DaemonSet that may patch every Node is a path to taking over the cluster. An object is written only when
its content changed, so a steady node costs the API server one GET per interval and no writes.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from webhook.core.domain.names import GROUP, INVENTORY_KIND, INVENTORY_PLURAL, INVENTORY_VERSION

VERSION, PLURAL, KIND = INVENTORY_VERSION, INVENTORY_PLURAL, INVENTORY_KIND
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-admission-agent"}
MAX_ATTEMPTS = 3


class PublishError(Exception):
    """The inventory could not be written; the message is one line for the log."""


def nvlink_summary(nvlink: list[list[int]]) -> str:
    """The printer column: "NV18" (every pair, same count), "NV12-NV18", "partial NV4" or "none"."""
    counts = [nvlink[i][j] for i in range(len(nvlink)) for j in range(i + 1, len(nvlink))]
    linked = [count for count in counts if count > 0]
    if not linked:
        return "none"
    low, high = min(linked), max(linked)
    if len(linked) < len(counts):
        return f"partial NV{high}"
    return f"NV{high}" if low == high else f"NV{low}-NV{high}"


def inventory_status(spec: dict[str, Any], driver_version: str) -> dict[str, Any]:
    """What `kubectl get gpuinventories` shows: derived from the spec, plus the driver version."""
    models = sorted({gpu["model"] for gpu in spec["gpus"]})
    status: dict[str, Any] = {
        "gpuCount": len(spec["gpus"]),
        "model": ",".join(models),
        "nvlink": nvlink_summary(spec["nvlink"]),
    }
    if driver_version:
        status["driverVersion"] = driver_version
    toolkit = spec.get("toolkit")
    if isinstance(toolkit, dict) and isinstance(toolkit.get("acceptEnvvarUnprivileged"), bool):
        status["visibleDevicesEnvvar"] = "accepted" if toolkit["acceptEnvvarUnprivileged"] else "ignored"
    return status


def inventory_object(node_name: str, spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The whole GPUInventory object for a node."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": node_name, "labels": dict(MANAGED_BY)},
        "spec": spec,
        "status": status,
    }


class InventoryPublisher:
    """Creates the node's GPUInventory, or replaces it when spec or status differ from what is stored.

    `api` is a kubernetes.client.CustomObjectsApi (or anything with its three methods). A replace carries
    the stored resourceVersion, so a concurrent writer makes it fail with 409 and it is retried on a fresh
    read rather than overwriting what it did not see.
    """

    def __init__(self, api: Any, node_name: str) -> None:
        self.api = api
        self.node_name = node_name

    def publish(self, spec: dict[str, Any], status: dict[str, Any]) -> str:
        """Write if needed; returns "created", "replaced" or "unchanged". Raises PublishError."""
        for _attempt in range(MAX_ATTEMPTS):
            current = self._get()
            if current is None:
                if self._create(spec, status):
                    return "created"
                continue
            if current.get("spec") == spec and current.get("status") == status:
                return "unchanged"
            if self._replace(current, spec, status):
                return "replaced"
        raise PublishError(f"GPUInventory {self.node_name!r}: gave up after {MAX_ATTEMPTS} conflicting writes")

    def _get(self) -> dict[str, Any] | None:
        try:
            found = self.api.get_cluster_custom_object(GROUP, VERSION, PLURAL, self.node_name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise PublishError(self._failure("read", err)) from None
        return dict(found)

    def _create(self, spec: dict[str, Any], status: dict[str, Any]) -> bool:
        body = inventory_object(self.node_name, spec, status)
        try:
            self.api.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
        except ApiException as err:
            if err.status == 409:  # created meanwhile: read it and compare again
                return False
            raise PublishError(self._failure("create", err)) from None
        return True

    def _replace(self, current: dict[str, Any], spec: dict[str, Any], status: dict[str, Any]) -> bool:
        body = inventory_object(self.node_name, spec, status)
        metadata = copy.deepcopy(current.get("metadata") or {})
        metadata["name"] = self.node_name
        metadata["labels"] = {**(metadata.get("labels") or {}), **MANAGED_BY}
        body["metadata"] = metadata
        try:
            self.api.replace_cluster_custom_object(GROUP, VERSION, PLURAL, self.node_name, body)
        except ApiException as err:
            if err.status == 409:  # someone wrote in between: start over from a fresh read
                return False
            raise PublishError(self._failure("update", err)) from None
        return True

    def _failure(self, action: str, err: ApiException) -> str:
        reason = (err.reason or "").strip() or "error"
        message = _api_message(err)
        if message:
            reason += f": {message}"
        hint = ""
        if err.status == 403:
            hint = " (the agent's service account needs get, create and update on gpuinventories)"
        elif err.status == 404:
            hint = " (is the GPUInventory CRD installed?)"
        return f"cannot {action} GPUInventory {self.node_name!r}: HTTP {err.status} {reason}{hint}"


def _api_message(err: ApiException) -> str:
    """The API server's own explanation (a webhook's denial message, for one), from the Status body."""
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError):
        return ""
    message = body.get("message", "") if isinstance(body, dict) else ""
    return " ".join(str(message).split())
