"""Shared fixtures: module-level caches are emptied after every test."""

from __future__ import annotations

from collections.abc import Iterator

import caches
import pytest


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    yield
    caches.reset()
