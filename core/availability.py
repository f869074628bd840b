"""Fail closed, fast: what the gate answers while its database or Redis cannot be reached (and
every other API call while the database cannot: `guard_database`, and the API's exception
handler answers an outage a call meets with `Unavailable.unreachable`).

Every call is then refused with `503 control_plane_unavailable` in the API's error shape (and
`"decision": "deny"`, so a client reading only the decision refuses too), within a second:

- `guard()` refuses at once while a store is known to be down. A store is marked down by the
  first call that meets its outage (`failed`): a connection refused or cut, a server shutting
  down, a Redis that does not answer. Nothing then touches it but one probe thread per store and
  process, which tries it again every `PROBE_INTERVAL_S` and marks it up once it answers.
- `connection_wait()` bounds how long a gate call waits for a pooled database connection
  (`CONNECTION_WAIT_S`, not the pool's own timeout, which is sized for a busy pool): a call at
  the start of an outage, before any failure was seen, is refused within the bound. A wait that
  times out is not an outage by itself (the pool may only be busy): it refuses this call and
  starts the probe, which marks the store down only if it cannot connect either.
- Every other request (`RequestConnectionWait`) waits as long, then the rest of the pool's own
  timeout only when the database refused none of the pool's connection attempts meanwhile: the
  first request to meet an outage is refused within a second too, and a request that meets a pool
  that is only busy still waits for it (ingest under load). Workers keep the pool's whole wait:
  a worker rides out a brief restart that a request should not wait for.
- Coming back costs no call a multi-second wait: once the database probe connects, it has the
  pool test and replace the connections it held from before the outage (`ConnectionPool.check`)
  before it marks the database up, so no call meets a dead connection (psycopg's pool checks one
  per `getconn` and waits a second between dead ones); and the pool gives up on a failed
  reconnection after half a second (settings.py; its default retries with backoff for five
  minutes, so the first call after an outage waited for the next retry: 7.1 s measured) and
  connects afresh when a call asks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from core import poolwait
from core.errors import DomainError

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

log = logging.getLogger(__name__)

CONNECTION_WAIT_S = 0.5
PROBE_INTERVAL_S = 0.2
PROBE_TIMEOUT_S = 2.0
DATABASE = "database"
REDIS = "redis"
# SQLSTATEs of a server that is going away or not yet accepting connections (class 08 is the
# connection exceptions; 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now).
_OUTAGE_STATES = ("57P01", "57P02", "57P03")


class Unavailable(DomainError):
    """A store the answer depends on cannot be reached: refused, nothing allowed or debited."""

    @classmethod
    def of(cls, store: str) -> Unavailable:
        """The refusal while `store` is down: a 503 that says the gate's answer (deny) too."""
        gate = {"decision": "deny", "reason": "control_plane_unavailable"}
        return cls._made(store, "; nothing was allowed", gate)

    @classmethod
    def unreachable(cls, store: str) -> Unavailable:
        """The same refusal for any other API call (no gate decision was asked for)."""
        return cls._made(store, "", {})

    @classmethod
    def _made(cls, store: str, allowed: str, gate: dict[str, str]) -> Unavailable:
        refusal = cls(
            "control_plane_unavailable",
            f"the control plane cannot reach its {store} just now{allowed} (retry later)",
            status=503,
            context={**gate, "retry_after": 1},
        )
        refusal.store = store
        return refusal

    store = ""


class _State:
    def __init__(self) -> None:
        self.down: dict[str, float] = {}  # store → time.monotonic() it was marked down
        self.probing: set[str] = set()
        self.generation = 0  # moved by `reset`: probes of an earlier generation stop


_state = _State()
_lock = threading.Lock()


def guard() -> None:
    """Raise Unavailable while a store is known to be down."""
    if _state.down:
        for store in tuple(_state.down):  # (a copy: a probe may mark one up meanwhile)
            raise Unavailable.of(store)


def guard_database() -> None:
    """Raise Unavailable (not a gate's answer) while the database is known to be down: every API
    call needs it, so none waits on it meanwhile (tenants.permissions' view mixin)."""
    if DATABASE in _state.down:
        raise Unavailable.unreachable(DATABASE)


def is_down(store: str) -> bool:
    return store in _state.down


def connection_wait(seconds: float = CONNECTION_WAIT_S) -> AbstractContextManager[None]:
    """Inside the block, taking a pooled database connection waits at most `seconds`
    (the backend, controlplane/postgres, reads it)."""
    return poolwait.waiting(poolwait.Wait(seconds, patient=False))


class RequestConnectionWait:
    """Every request's wait for a pooled database connection: `CONNECTION_WAIT_S`, then the pool's
    own timeout unless the database refused a connection meanwhile (an outage met is then a 503
    within a second, by the API's exception handler or the console's handler500; the gate's route
    bounds its wait further). Outermost of the layers that read the database."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with poolwait.waiting(_REQUEST_WAIT):
            return self.get_response(request)


_REQUEST_WAIT = poolwait.Wait(CONNECTION_WAIT_S, patient=True)


def outage(exc: BaseException) -> str | None:
    """The store `exc` says cannot be reached (DATABASE or REDIS), or None when it says
    something else (a query's own error, a lock timeout, a busy SQLite file)."""
    import psycopg
    import psycopg_pool
    import redis

    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, psycopg_pool.PoolTimeout):
            return DATABASE
        if isinstance(error, psycopg.OperationalError):
            state = error.sqlstate
            if state is None or state.startswith("08") or state in _OUTAGE_STATES:
                return DATABASE
        if isinstance(error, redis.ConnectionError | redis.TimeoutError):
            return REDIS
        error = error.__cause__ or error.__context__
    return None


def failed(exc: BaseException, *, probe: Callable[[], None] | None = None) -> Unavailable | None:
    """`exc` met by a call: when it is an outage, the Unavailable to answer with (the store is
    marked down, or for a connection wait that ran out, probed); else None."""
    store = outage(exc)
    if store is None:
        return None
    import psycopg_pool

    busy_or_down = any(isinstance(e, psycopg_pool.PoolTimeout) for e in _chain(exc))
    mark(store, probe=probe, confirmed=not busy_or_down, why=f"{type(exc).__name__}: {exc}")
    return Unavailable.of(store)


def refusal_for(exc: BaseException) -> Unavailable | None:
    """`failed` for any call but the gate's: the refusal names no decision (none was asked for)."""
    met = failed(exc)
    return None if met is None else Unavailable.unreachable(met.store)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def mark(
    store: str, *, probe: Callable[[], None] | None = None, confirmed: bool = True, why: str = ""
) -> None:
    """Mark `store` down (`confirmed`), or only suspect it, and start its probe if none runs."""
    with _lock:
        if confirmed and store not in _state.down:
            _state.down[store] = time.monotonic()
            log.warning("the %s is unreachable: the gate refuses until it answers (%s)", store, why[:300])
        if store in _state.probing:
            return
        _state.probing.add(store)
        generation = _state.generation
    check = probe or _PROBES[store]
    thread = threading.Thread(
        target=_probe_until_up, args=(store, check, generation), name=f"probe-{store}", daemon=True
    )
    thread.start()


def _probe_until_up(store: str, probe: Callable[[], None], generation: int) -> None:
    from django.db import connections

    while _state.generation == generation:
        try:
            probe()
        except Exception as exc:
            with _lock:
                if _state.generation != generation:
                    return
                if store not in _state.down:
                    _state.down[store] = time.monotonic()
                    log.warning("the %s is unreachable: the gate refuses until it answers (%s)", store, exc)
            time.sleep(PROBE_INTERVAL_S)  # the probe's own pace; callers never wait on it
            continue
        finally:
            connections.close_all()  # what a probe read through Django goes back to the pool
        with _lock:
            if _state.generation != generation:
                return
            since = _state.down.pop(store, None)
            _state.probing.discard(store)
        if since is not None:
            log.warning("the %s answers again after %.1f s", store, time.monotonic() - since)
        return


def reset() -> None:
    """Forget every mark and stop every probe (tests: each starts with reachable stores)."""
    with _lock:
        _state.down.clear()
        _state.probing.clear()
        _state.generation += 1


# ----------------------------------------------------------------------------------- the probes


def _probe_database() -> None:
    """Connect afresh (not through the pool, which may be waiting out a failed attempt, or only be
    busy); then have the pool drop the connections the outage broke and open new ones, so the
    next call finds one ready (or being opened) instead of discarding dead ones one by one."""
    import psycopg
    from django.db import connection

    params = {**connection.get_connection_params(), "connect_timeout": max(2, round(PROBE_TIMEOUT_S))}
    direct = psycopg.connect(**params)
    direct.close()
    pool: Any = getattr(connection, "pool", None)
    if pool is not None:
        pool.open()
        pool.check()


def _probe_redis() -> None:
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=PROBE_TIMEOUT_S, socket_connect_timeout=PROBE_TIMEOUT_S
    )
    try:
        client.ping()
    finally:
        client.close()


_PROBES: dict[str, Callable[[], None]] = {DATABASE: _probe_database, REDIS: _probe_redis}
