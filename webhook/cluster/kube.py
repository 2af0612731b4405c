"""The kubernetes-client boundary: list and watch the five kinds as raw JSON dicts.

Responses are read with `_preload_content=False` and decoded with `json` ourselves: no generated model
objects are built (they cost far more memory and time than the dicts), and the watch loop sees exactly
the bytes the API server sent, the same shape as the recorded streams in the tests.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from webhook.core.domain.names import GROUP as INVENTORY_GROUP
from webhook.core.domain.names import INVENTORY_KIND, INVENTORY_PLURAL, INVENTORY_VERSION

DRA_GROUP, DRA_VERSION = "resource.k8s.io", "v1"  # GA in Kubernetes 1.34
# Kinds served by CustomObjectsApi (group, version, plural) that a cluster may lack: the GPUInventory
# CRD when not installed, resource.k8s.io/v1 before Kubernetes 1.34. Absent: an empty list, looked for again.
OPTIONAL: Mapping[str, tuple[str, str, str]] = {
    INVENTORY_PLURAL: (INVENTORY_GROUP, INVENTORY_VERSION, INVENTORY_PLURAL),
    "resourceclaims": (DRA_GROUP, DRA_VERSION, "resourceclaims"),
    "resourceclaimtemplates": (DRA_GROUP, DRA_VERSION, "resourceclaimtemplates"),
}

# kind (plural, lower case) -> (apiVersion, Kind) that the items of a list lack and we add back
KINDS: Mapping[str, tuple[str, str]] = {
    "nodes": ("v1", "Node"),
    "pods": ("v1", "Pod"),
    "namespaces": ("v1", "Namespace"),
    "resourcequotas": ("v1", "ResourceQuota"),
    INVENTORY_PLURAL: (f"{INVENTORY_GROUP}/{INVENTORY_VERSION}", INVENTORY_KIND),
    "resourceclaims": (f"{DRA_GROUP}/{DRA_VERSION}", "ResourceClaim"),
    "resourceclaimtemplates": (f"{DRA_GROUP}/{DRA_VERSION}", "ResourceClaimTemplate"),
    "configmaps": ("v1", "ConfigMap"),
}
PAGE_SIZE = 500


class KubeLister:
    """list_fn / stream_fn over a kubernetes `ApiClient` (see `watch.Reflector`)."""

    def __init__(
        self,
        api_client: Any,
        *,
        page_size: int = PAGE_SIZE,
        request_timeout: float = 30.0,
        absent_recheck: float = 30.0,
    ) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.page_size = page_size
        self.request_timeout = request_timeout
        self.absent_recheck = absent_recheck  # seconds between looks for a GPUInventory CRD that is missing

    def _call(self, kind: str) -> Callable[..., Any]:
        if kind == "nodes":
            return self.core.list_node
        if kind == "pods":
            return self.core.list_pod_for_all_namespaces
        if kind == "namespaces":
            return self.core.list_namespace
        if kind == "resourcequotas":
            return self.core.list_resource_quota_for_all_namespaces
        if kind == "configmaps":
            return self.core.list_config_map_for_all_namespaces
        if kind in OPTIONAL:
            group, version, plural = OPTIONAL[kind]

            def list_custom(**kwargs: Any) -> Any:
                return self.custom.list_cluster_custom_object(group, version, plural, **kwargs)

            return list_custom
        raise ValueError(f"unknown kind {kind!r}")

    def list_pages(self, kind: str) -> Iterator[Mapping[str, Any]]:
        """The list, page by page (a consistent snapshot: every page shares the first page's version)."""
        call = self._call(kind)
        api_version, kind_name = KINDS[kind]
        token = ""
        while True:
            kwargs: dict[str, Any] = {
                "limit": self.page_size,
                "_preload_content": False,
                "_request_timeout": self.request_timeout,
            }
            if token:
                kwargs["_continue"] = token
            try:
                response = call(**kwargs)
            except Exception as error:
                if kind in OPTIONAL and getattr(error, "status", None) == 404:
                    yield {"metadata": {"resourceVersion": ""}, "items": []}  # no CRD / no API: none of them
                    return
                raise
            page = json.loads(response.data)
            for item in page.get("items") or ():
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind_name)
            yield page
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    def stream(self, kind: str, resource_version: str, timeout: int) -> Iterator[Mapping[str, Any]]:
        """Watch events from `resource_version`, with bookmarks, until the server ends the stream."""
        from kubernetes.watch.watch import iter_resp_lines

        from .watch import Gone

        if kind in OPTIONAL and not resource_version:
            # The CRD (or API) was not there when we listed: wait a watch's length, then list again.
            time.sleep(min(timeout, self.absent_recheck))
            if kind == INVENTORY_PLURAL:
                raise Gone("the GPUInventory CRD is not installed")
            raise Gone(f"{DRA_GROUP}/{DRA_VERSION} {kind} are not served (Kubernetes before 1.34)")
        call = self._call(kind)
        response = call(
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            _preload_content=False,
            _request_timeout=(self.request_timeout, timeout + 30),
        )
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if line:
                    yield json.loads(line)
        finally:
            response.release_conn()


def list_all(api_client: Any) -> list[dict[str, Any]]:
    """Every object of the five kinds, as the API server returns them (for `snapshot` and `check`)."""
    lister = KubeLister(api_client)
    objects: list[dict[str, Any]] = []
    for kind in KINDS:
        for page in lister.list_pages(kind):
            objects.extend(page.get("items") or ())
    return objects
