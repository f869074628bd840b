"""A request's wait for a pooled Postgres connection (controlplane/postgres/base.py): a pool that
is only busy is waited out past the first half second; a database that refuses the pool's
connection attempts ends the wait after it; the gate's wait ends after it whatever the cause."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg_pool import ConnectionPool, PoolTimeout

from controlplane.postgres.base import _WaitingPool
from core.poolwait import Wait
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

FIRST_S = 0.2
POOL_TIMEOUT_S = 30.0  # only ends a hung run: every outcome below comes sooner


def _pool(**kwargs: Any) -> ConnectionPool:
    return ConnectionPool(
        min_size=0, max_size=1, timeout=POOL_TIMEOUT_S, reconnect_timeout=0.5, open=True, **kwargs
    )


@pytest.fixture
def busy_pool() -> Iterator[tuple[ConnectionPool, psycopg.Connection[Any]]]:
    """The test database's pool of one, its only connection taken."""
    pool = _pool(kwargs={**connection.get_connection_params(), "autocommit": True})
    held = pool.getconn()
    try:
        yield pool, held
    finally:
        pool.close()
        held.close()  # when a test kept it: the pool closes only the connections it holds


def test_a_request_waits_out_a_busy_pool_past_its_first_wait(
    busy_pool: tuple[ConnectionPool, psycopg.Connection[Any]],
) -> None:
    pool, held = busy_pool
    got: list[object] = []
    patient = _WaitingPool(pool, Wait(FIRST_S, patient=True))
    waiter = threading.Thread(target=lambda: got.append(_take(patient)))
    waiter.start()
    # The first wait has run out and the second begun (each asks the pool once); only then the
    # connection comes back.
    wait_until(lambda: pool.get_stats()["requests_num"] >= 3, "the request to wait a second time")
    pool.putconn(held)
    waiter.join(timeout=POOL_TIMEOUT_S)
    assert got and isinstance(got[0], psycopg.Connection), got
    assert pool.get_stats().get("connections_errors", 0) == 0


def test_the_gates_wait_ends_after_its_bound_on_a_busy_pool(
    busy_pool: tuple[ConnectionPool, psycopg.Connection[Any]],
) -> None:
    pool, _held = busy_pool
    with pytest.raises(PoolTimeout, match="couldn't get a connection"):
        _WaitingPool(pool, Wait(FIRST_S, patient=False)).getconn()
    assert pool.get_stats()["requests_num"] == 2  # asked once: no second wait


def test_a_request_meeting_refused_connections_is_refused_after_its_first_wait() -> None:
    unreachable = {**connection.get_connection_params(), "host": "127.0.0.1", "port": free_port()}
    pool = _pool(kwargs=unreachable)
    try:
        with pytest.raises(PoolTimeout, match="the database refused a connection"):
            _WaitingPool(pool, Wait(FIRST_S, patient=True)).getconn()
        assert pool.get_stats()["connections_errors"] >= 1
        assert pool.get_stats()["requests_num"] == 1  # no second wait
    finally:
        pool.close()


def _take(pool: _WaitingPool) -> object:
    conn = pool.getconn()
    pool.putconn(conn)
    return conn
