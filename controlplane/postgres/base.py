"""Django's PostgreSQL backend, with one addition: how long a call waits for a pooled connection.
The pool's own timeout (`DB_POOL_TIMEOUT`) is sized for a pool that is busy. A call that must
answer within a second whatever happens (the gate) bounds its wait
(`core.availability.connection_wait`) and is refused when it runs out; any other call waits the
pool's timeout only while the database can be reached (`core.availability.pooled_connection`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.backends.postgresql import base

from core.poolwait import current


class _CallersPool:
    """The process' pool, as seen by one call: it waits at most `wait` seconds for a connection
    when the call bounded its wait, else as `pooled_connection` decides."""

    def __init__(self, pool: Any, wait: float | None, params: Callable[[], dict[str, Any]]) -> None:
        self._pool = pool
        self._wait = wait
        self._params = params

    def getconn(self, timeout: float | None = None) -> Any:
        if timeout is not None:
            return self._pool.getconn(timeout=timeout)
        if self._wait is not None:
            return self._pool.getconn(timeout=min(self._wait, self._pool.timeout))
        from core.availability import pooled_connection

        return pooled_connection(self._pool, self._params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        pool = super().pool
        return None if pool is None else _CallersPool(pool, current(), self.get_connection_params)
