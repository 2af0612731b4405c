"""The kubernetes-client boundary: list and watch the kinds the cache needs as raw JSON dicts.

Responses are read with `_preload_content=False` and decoded with `json` ourselves: no generated model
objects are built (they cost far more memory and time than the dicts), and the watch loop sees exactly
the bytes the API server sent, the same shape as the recorded streams in the tests.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from webhook.core.domain.names import GROUP as INVENTORY_GROUP
from webhook.core.domain.names import INVENTORY_KIND, INVENTORY_PLURAL, INVENTORY_VERSION

from .nodepools import POOL_KINDS

DRA_GROUP, DRA_VERSION = "resource.k8s.io", "v1"  # GA in Kubernetes 1.34
# Kinds served by CustomObjectsApi (group, version, plural) that a cluster may lack: the GPUInventory
# CRD when not installed, resource.k8s.io/v1 before Kubernetes 1.34. Absent: an empty list, looked for again.
OPTIONAL: Mapping[str, tuple[str, str, str]] = {
    INVENTORY_PLURAL: (INVENTORY_GROUP, INVENTORY_VERSION, INVENTORY_PLURAL),
    "resourceclaims": (DRA_GROUP, DRA_VERSION, "resourceclaims"),
    "resourceclaimtemplates": (DRA_GROUP, DRA_VERSION, "resourceclaimtemplates"),
}
# The controllers' objects that state a multi-pod group's size (core/placement/groups.py `sizes_of`):
# kind (our name for it) -> (group, version, plural, Kind). Each is optional: a cluster without the
# controller (or a role without the right to read it: 403) lists none, and looks again later.
GROUP_SIZE_KINDS: Mapping[str, tuple[str, str, str, str]] = {
    "pytorchjobs": ("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"),
    "tfjobs": ("kubeflow.org", "v1", "tfjobs", "TFJob"),
    "mpijobs": ("kubeflow.org", "v2beta1", "mpijobs", "MPIJob"),
    "jobsets": ("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet"),
    "rayclusters": ("ray.io", "v1", "rayclusters", "RayCluster"),
    "volcanojobs": ("batch.volcano.sh", "v1alpha1", "jobs", "Job"),
    "volcanopodgroups": ("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup"),
    "podgroups": ("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup"),
    "xgboostjobs": ("kubeflow.org", "v1", "xgboostjobs", "XGBoostJob"),
    "paddlejobs": ("kubeflow.org", "v1", "paddlejobs", "PaddleJob"),
    "jaxjobs": ("kubeflow.org", "v1", "jaxjobs", "JAXJob"),
}
# Optional APIs that may also be unreadable (403): group sizes, and the node pools that scale from zero
# (Karpenter NodePools, Cluster API node groups: nodepools.py); either lists none and is looked for again.
UNREADABLE_OK: Mapping[str, tuple[str, str, str, str]] = {**GROUP_SIZE_KINDS, **POOL_KINDS}
OPTIONAL = {**OPTIONAL, **{kind: spec[:3] for kind, spec in UNREADABLE_OK.items()}}

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
    **{kind: (f"{group}/{version}", name) for kind, (group, version, _, name) in UNREADABLE_OK.items()},
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
        self.stop = threading.Event()  # set: that wait ends at once (the watches are closing)

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
                status = getattr(error, "status", None)
                if kind in OPTIONAL and (status == 404 or (status == 403 and kind in UNREADABLE_OK)):
                    # no CRD / no API: none of them (a group's size unreadable: the group stays open-ended;
                    # node pools unreadable: only the policy's pools scale from zero)
                    yield {"metadata": {"resourceVersion": ""}, "items": []}
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
            self.stop.wait(min(timeout, self.absent_recheck))
            if kind == INVENTORY_PLURAL:
                raise Gone("the GPUInventory CRD is not installed")
            if kind in UNREADABLE_OK:
                group, version, plural, _ = UNREADABLE_OK[kind]
                raise Gone(f"{group}/{version} {plural} are not served (or not readable)")
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
