"""Django's PostgreSQL backend, with one addition: a call may bound how long it waits for a pooled
connection (`core.poolwait`). The pool's own timeout (`DB_POOL_TIMEOUT`) is sized for a pool that
is busy; the gate waits at most half a second and is refused when the wait runs out, and any other
request waits that long, then the rest of the pool's timeout only if the database did not refuse a
connection meanwhile (the pool's own count of failed connection attempts): a request that meets
an outage is refused within a second, one that meets a busy pool is served."""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base
from psycopg_pool import PoolTimeout

from core.poolwait import Wait, current


class _WaitingPool:
    """The process' pool, as seen by a call whose wait for a connection is `wait`."""

    def __init__(self, pool: Any, wait: Wait) -> None:
        self._pool = pool
        self._wait = wait

    def getconn(self, timeout: float | None = None) -> Any:
        if timeout is not None:
            return self._pool.getconn(timeout=timeout)
        first = min(self._wait.first, self._pool.timeout)
        if not self._wait.patient:
            return self._pool.getconn(timeout=first)
        refused_before = _refused_connections(self._pool)
        try:
            return self._pool.getconn(timeout=first)
        except PoolTimeout as timed_out:
            if _refused_connections(self._pool) != refused_before:
                raise PoolTimeout(
                    f"the database refused a connection while this call waited {first:g} s"
                ) from timed_out
            if first >= self._pool.timeout:
                raise
        return self._pool.getconn(timeout=self._pool.timeout - first)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def _refused_connections(pool: Any) -> int:
    return int(pool.get_stats().get("connections_errors", 0))


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        pool = super().pool
        wait = current()
        return pool if pool is None or wait is None else _WaitingPool(pool, wait)
