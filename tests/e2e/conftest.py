"""One control plane and one chart release for the whole end-to-end session; each test module works in
namespaces of its own. Built binaries are cached, so only the first run on a machine pays the build."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e.controlplane import ControlPlane, start_control_plane
from e2e.harness import Webhook, api_client, create_inventory, create_node, demo_objects, install
from kubernetes import client


@pytest.fixture(scope="session")
def plane() -> Iterator[ControlPlane]:
    started = start_control_plane()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="session")
def admin(plane: ControlPlane) -> client.ApiClient:
    return api_client(plane.admin_kubeconfig)


@pytest.fixture(scope="session")
def webhook(plane: ControlPlane, admin: client.ApiClient) -> Iterator[Webhook]:
    """The chart installed with its defaults (opt-in namespaces, matchConditions on), the demo cluster's
    GPU nodes and inventories created, one serve replica running."""
    served = install(plane, admin, values={})
    try:
        for inventory in demo_objects("GPUInventory"):
            create_inventory(admin, inventory)
        for node in demo_objects("Node"):
            create_node(admin, node)
        yield served
    finally:
        served.stop()
