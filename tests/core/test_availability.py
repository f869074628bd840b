"""core.availability: which errors are an outage, the refusal while a store is down, the
probe that lifts it, and the bound on a call's wait for a pooled connection."""

from __future__ import annotations

import sqlite3
import threading
import time

import psycopg
import psycopg.errors
import psycopg_pool
import pytest
import redis
from django.db import DatabaseError, IntegrityError, OperationalError, connection

from core import availability
from tests.support.waiting import wait_until


def _wrapped(inner: BaseException, outer: type[BaseException] = OperationalError) -> BaseException:
    """As Django raises a driver's error: its own class, the driver's as the cause."""
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer(str(exc)) from exc
    except BaseException as wrapped:
        return wrapped


@pytest.mark.parametrize(
    ("error", "store"),
    [
        (_wrapped(psycopg.OperationalError("connection refused")), availability.DATABASE),
        (_wrapped(psycopg.errors.AdminShutdown("terminating connection")), availability.DATABASE),
        (
            _wrapped(psycopg.errors.CannotConnectNow("starting up")),
            availability.DATABASE,
        ),
        (psycopg_pool.PoolTimeout("couldn't get a connection after 0.50 sec"), availability.DATABASE),
        (redis.ConnectionError("Error 111 connecting to 127.0.0.1:6390"), availability.REDIS),
        (redis.TimeoutError("Timeout reading from socket"), availability.REDIS),
        (_wrapped(redis.ConnectionError("refused"), RuntimeError), availability.REDIS),
        # A query's own error, a cancelled statement, a deadlock, a busy SQLite file: not an outage.
        (_wrapped(psycopg.errors.QueryCanceled("statement timeout")), None),
        (_wrapped(psycopg.errors.DeadlockDetected("deadlock")), None),
        (_wrapped(psycopg.errors.UniqueViolation("duplicate"), IntegrityError), None),
        (_wrapped(sqlite3.OperationalError("database is locked")), None),
        (DatabaseError("something else"), None),
        (redis.ResponseError("NOSCRIPT"), None),
        (ValueError("no"), None),
    ],
)
def test_an_outage_is_told_from_other_errors(error: BaseException, store: str | None) -> None:
    assert availability.outage(error) == store


def test_a_store_marked_down_refuses_until_its_probe_answers() -> None:
    answering = threading.Event()

    def probe() -> None:
        if not answering.is_set():
            raise ConnectionRefusedError("still down")

    refusal = availability.failed(redis.ConnectionError("refused"), probe=probe)
    assert refusal is not None and refusal.status == 503
    assert refusal.body() == {
        "error": "control_plane_unavailable",
        "detail": refusal.detail,
        "decision": "deny",
        "reason": "control_plane_unavailable",
        "retry_after": 1,
    }
    with pytest.raises(availability.Unavailable):
        availability.guard()
    assert availability.is_down(availability.REDIS)
    answering.set()
    wait_until(
        lambda: not availability.is_down(availability.REDIS), "the probe to mark Redis up", deadline=30.0
    )
    availability.guard()  # nothing refused any more


def test_a_connection_wait_that_runs_out_only_suspects_the_database() -> None:
    """The pool may only be busy: the call is refused and the probe asked, which finds the
    database answering and marks nothing down."""
    probed = threading.Event()

    def probe() -> None:
        probed.set()

    refusal = availability.failed(psycopg_pool.PoolTimeout("couldn't get a connection"), probe=probe)
    assert refusal is not None and refusal.store == availability.DATABASE
    wait_until(probed.is_set, "the probe", deadline=30.0)
    assert not availability.is_down(availability.DATABASE)
    availability.guard()


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_call_waits_for_a_pooled_connection_only_as_long_as_its_bound() -> None:
    connection.ensure_connection()
    pool = connection.pool
    held = []
    try:
        while True:  # take every connection the pool has room for
            try:
                held.append(pool.getconn(timeout=0.5))
            except psycopg_pool.PoolTimeout:
                break
        started = time.monotonic()
        with availability.connection_wait(0.2), pytest.raises(psycopg_pool.PoolTimeout):
            connection.pool.getconn()
        assert time.monotonic() - started < pool.timeout  # 0.2 s, not the pool's 10
    finally:
        for conn in held:
            pool.putconn(conn)
