"""Shared fixtures: the small clusters and the policy many tests start from, and module-level caches
emptied after every test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import caches
import pytest
from builders import A100, H100, L4, node, snapshot
from server_support import cluster_objects

from webhook.cluster.translate import build_snapshot
from webhook.core.domain.model import Snapshot

E2E = Path(__file__).resolve().parent / "e2e"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/e2e runs against a real control plane built from Go modules: only when named on the command
    line (`pytest tests/e2e`), never in the default `pytest`."""
    if collection_path != E2E:
        return None
    named = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    return not any(path == E2E or E2E in path.parents for path in named)


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    yield
    caches.reset()


@pytest.fixture
def live_snapshot() -> Snapshot:
    """The server tests' cluster (server_support.cluster_objects) as the watch cache would see it."""
    return build_snapshot(cluster_objects())


@pytest.fixture
def mixed_cluster() -> Snapshot:
    """An NVSwitch H100 node, an NVLink-paired A100 node and a two-card L4 node without links."""
    return snapshot(node("h1", H100, 8), node("a1", A100, 8, "paired"), node("l1", L4, 2, "none"))
