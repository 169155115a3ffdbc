"""The one classifier of storage outages (``app.storage.db.is_storage_outage``): the API's 503."""

from __future__ import annotations

import psycopg2
import psycopg2.errors
import pytest
from sqlalchemy import exc as sa_exc

from app.jobs.errors import TransientStorageError
from app.storage.db import is_storage_outage


def _wrapped(
    orig: BaseException, cls: type[sa_exc.DBAPIError] = sa_exc.DBAPIError, **kw: bool
) -> BaseException:
    return cls("SELECT 1", None, orig, **kw)  # type: ignore[arg-type]


def _raised_from(cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise RuntimeError("while handling") from inner
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(
    "exc",
    [
        TransientStorageError("x"),
        psycopg2.OperationalError("server closed the connection unexpectedly"),  # raw, at pool reset
        psycopg2.InterfaceError("connection already closed"),
        _wrapped(psycopg2.OperationalError("terminating connection"), sa_exc.OperationalError),
        _wrapped(psycopg2.InterfaceError("connection already closed"), sa_exc.InterfaceError),
        _wrapped(psycopg2.DatabaseError("lost synchronization"), connection_invalidated=True),
        sa_exc.TimeoutError("QueuePool limit of size 10 overflow 20 reached"),
        sa_exc.DisconnectionError("checkout failed"),
        _raised_from(psycopg2.OperationalError("could not connect")),
    ],
    ids=lambda e: type(e).__name__,
)
def test_outages_are_recognised(exc: BaseException) -> None:
    assert is_storage_outage(exc)


def test_sqlstate_classes_of_a_server_going_away_are_outages() -> None:
    class Coded(Exception):  # psycopg2's pgcode is read-only: a stand-in carrying one
        pgcode = "57P01"  # admin_shutdown

    assert is_storage_outage(_wrapped(Coded("terminating connection due to administrator command")))


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("bug"),
        _wrapped(psycopg2.IntegrityError("duplicate key"), sa_exc.IntegrityError),
        _wrapped(psycopg2.ProgrammingError("syntax error"), sa_exc.ProgrammingError),
        sa_exc.InvalidRequestError("misuse"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_bugs_and_bad_data_are_not_outages(exc: BaseException) -> None:
    assert not is_storage_outage(exc)
