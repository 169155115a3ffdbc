"""API fixtures: an app per test over the parametrised ``engine`` (helpers: ``tests/support/api.py``).

Every ``Api`` asserts at teardown that no request reached the catch-all 500 handler.
"""

from __future__ import annotations

# Some names below (noqa: F401) are re-exported for tests written before tests/support existed;
# new tests import them from tests.support.
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy.engine import Engine

from app.config import Settings
from tests.support.api import (  # noqa: F401
    LEASE_MS,
    ORG_A,
    ORG_B,
    WORKER,
    Api,
    EventReader,
    auth_context,
    build_api,
    make_settings,
    payload,
)


@pytest.fixture
def api_settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
def api(engine: Engine, api_settings: Settings) -> Iterator[Api]:
    """The API over the parametrised backend (SQLite and PostgreSQL)."""
    built = build_api(engine, api_settings)
    yield built
    assert built.state.internal_errors == 0, "a request reached the catch-all 500 handler"


@pytest.fixture
def sqlite_api(sqlite_engine: Engine, api_settings: Settings) -> Iterator[Api]:
    """The API over SQLite only (for tests whose subject is not the database)."""
    built = build_api(sqlite_engine, api_settings)
    yield built
    assert built.state.internal_errors == 0, "a request reached the catch-all 500 handler"


@pytest.fixture
def open_events(request: pytest.FixtureRequest) -> Iterator[Any]:
    """``open_events(client, url, headers)`` → an ``EventReader``; closed at teardown."""
    readers: list[EventReader] = []

    def _open(client: FlaskClient, url: str, headers: dict[str, str]) -> EventReader:
        response = client.get(url, headers=headers, buffered=False)
        assert response.status_code == 200, response.get_data()
        assert response.mimetype == "text/event-stream"
        reader = EventReader(response)
        readers.append(reader)
        return reader

    yield _open
    for reader in readers:
        reader.close()
