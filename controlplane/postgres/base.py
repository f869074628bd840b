"""Django's PostgreSQL backend, with one addition: a call may bound how long it waits for a pooled
connection (`core.availability.connection_wait`). The pool's own timeout
(`DB_POOL_TIMEOUT`) is sized for a pool that is busy; a call that must answer within a second
whatever happens (the gate) waits less, and is refused when the wait runs out."""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base

from core.poolwait import current


class _BoundedPool:
    """The process' pool, as seen by a call that waits at most `wait` seconds for a connection."""

    def __init__(self, pool: Any, wait: float) -> None:
        self._pool = pool
        self._wait = wait

    def getconn(self, timeout: float | None = None) -> Any:
        return self._pool.getconn(timeout=min(self._wait, self._pool.timeout) if timeout is None else timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        pool = super().pool
        wait = current()
        return pool if pool is None or wait is None else _BoundedPool(pool, wait)
