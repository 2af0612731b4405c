"""An in-memory CustomObjectsApi for the GPUInventory calls the node agent makes, with injected failures."""

from __future__ import annotations

import copy
import json

from kubernetes.client.exceptions import ApiException

ROUTE = ("gpu-admission.io", "v1alpha1", "gpuinventories")


class FakeCustomObjects:
    """The three CustomObjectsApi calls the publisher makes, over an in-memory store of cluster objects.

    `fail` maps a call name to a list of HTTP statuses to raise on its next calls, in order.
    """

    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[str, list[int]] = {}
        self.version = 0

    def _maybe_fail(self, call: str) -> None:
        pending = self.fail.get(call)
        if pending:
            status = pending.pop(0)
            raise _api_error(status, json.dumps({"kind": "Status", "message": f"injected {status}"}))

    def _stored(self, body: dict) -> dict:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        return stored

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str) -> dict:
        assert (group, version, plural) == ROUTE
        self.calls.append(("get", name))
        self._maybe_fail("get")
        if name not in self.objects:
            raise _api_error(404, json.dumps({"message": f'gpuinventories "{name}" not found'}))
        return copy.deepcopy(self.objects[name])

    def create_cluster_custom_object(self, group: str, version: str, plural: str, body: dict) -> dict:
        assert (group, version, plural) == ROUTE
        name = body["metadata"]["name"]
        self.calls.append(("create", name))
        self._maybe_fail("create")
        if name in self.objects:
            raise _api_error(409, "{}")
        self.objects[name] = self._stored(body)
        return copy.deepcopy(self.objects[name])

    def replace_cluster_custom_object(self, group: str, version: str, plural: str, name: str, body: dict) -> dict:
        assert (group, version, plural) == ROUTE
        self.calls.append(("replace", name))
        self._maybe_fail("replace")
        if body["metadata"].get("resourceVersion") != self.objects[name]["metadata"]["resourceVersion"]:
            raise _api_error(409, "{}")
        self.objects[name] = self._stored(body)
        return copy.deepcopy(self.objects[name])


def _api_error(status: int, body: str) -> ApiException:
    err = ApiException(status=status, reason={403: "Forbidden", 404: "Not Found", 409: "Conflict"}.get(status, "Error"))
    err.body = body
    return err


def refusing_lister(status: int) -> object:
    """A `KubeLister` whose custom-object lists all fail with HTTP `status` (404: the API is absent; 403:
    the role may not read it), paging 10 at a time and looking for absent APIs again at once."""
    from webhook.cluster import kube

    class Refused(Exception):
        def __init__(self) -> None:
            super().__init__(f"HTTP {status}")
            self.status = status

    class Custom:
        def list_cluster_custom_object(self, *args: object, **kwargs: object) -> object:
            raise Refused()

    lister = kube.KubeLister.__new__(kube.KubeLister)
    lister.page_size, lister.request_timeout, lister.absent_recheck = 10, 1.0, 0.0
    lister.custom = Custom()
    return lister
