"""Fixtures of the server tests: a live app (the real core) over the small cluster of server_support."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient
from server_support import Calls, fake_core, live_app, make_app

from webhook.server.source import StaticSource


@pytest.fixture
def live_server() -> tuple[FlaskClient, StaticSource]:
    return live_app()


@pytest.fixture
def live_client(live_server: tuple[FlaskClient, StaticSource]) -> FlaskClient:
    return live_server[0]


@pytest.fixture
def live_source(live_server: tuple[FlaskClient, StaticSource]) -> StaticSource:
    """The source `live_client` answers from: the reservations it made."""
    return live_server[1]


@pytest.fixture
def coreless_client() -> FlaskClient:
    """An app whose core fails the test if asked: for requests the server must answer before the core."""
    return make_app(fake_core(Calls(forbid=True).mutate, Calls(forbid=True).validate)).test_client()
