"""A tenant's change epoch: one counter in the shared cache (Redis in production) that every change
a per-process cache depends on moves once it commits — fleet policies, halts and quarantines,
approval policies. Beside it, the tenant's hold: set while a change that must take effect at once
everywhere (an API key's revocation) commits, for longer than any copy may live.

Hot paths (the gate, API-key authentication) keep per-process copies of what they read from the
database and reuse a copy only while the epoch still reads as it did when the copy was made: one
cache round trip (`read`: the counter and the hold together), instead of the queries the copy
saves. Because the bump runs when the change commits, before its API call answers, the next call
anywhere sees the change.

What the counter cannot promise, a bound covers: a bump that failed (the cache unreachable just
then) or a per-process cache (embedded mode's locmem) is caught up by `MAX_AGE_S` — no copy is
reused for longer than that, whatever the counter says. A cache that cannot be read means no copy
is reused at all (`read` answers None).

The hold closes that bound where it must be closed (`hold`, before the change commits): while it
is on, API-key copies are neither reused nor made, so every request reads the key's row; it lasts
`HOLD_S`, longer than `MAX_AGE_S`, so when it ends every copy made before it began has aged out.
No post-commit signal is needed, and none can be lost. Should the hold itself fail, the change
waits `MAX_AGE_S` after its commit before it answers (`hold`'s caller), which ages every copy out
just the same.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from core.postcommit import after_commit

log = logging.getLogger(__name__)

# No per-process copy is reused longer than this, whatever the counter says.
MAX_AGE_S = 1.0
# How long a hold lasts: longer than MAX_AGE_S (the argument above), with room for the holding
# transaction to commit on a loaded machine.
HOLD_S = 30.0


@dataclass(frozen=True)
class Epoch:
    """The tenant's epoch as one request read it. Copies compare `counter` and `held`; `at` (this
    process' monotonic clock just before the read) is when a copy made under it was born."""

    counter: Any
    held: bool
    at: float = field(compare=False)


def key(tenant_id: int) -> str:
    # The fleet status long-poll waits on this key too (its historical name).
    return f"fleet:version:{tenant_id}"


def hold_key(tenant_id: int) -> str:
    return f"tenant:hold:{tenant_id}"


_reader: tuple[Any, Any, Any] | None = None


def _redis_reader() -> tuple[Any, Any, Any] | None:
    """(client, make_key, serializer) reading the default cache's own Redis keys, or None when
    the cache is not Redis. One client per process over the cache's connection pool: Django's
    cache builds a new redis-py client (and its callback tables) for every operation, which cost
    more CPU than the GET itself on the gate's hot path."""
    global _reader
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    cache = caches["default"]
    if not isinstance(cache, RedisCache):
        return None
    if _reader is None or _reader[1] != cache.make_key:
        backend: Any = cache._cache  # Django's RedisCacheClient (no public pool accessor)
        client = backend._client(connection_pool=backend._get_connection_pool(False))
        _reader = (client, cache.make_key, backend._serializer)
    return _reader


def read(tenant_id: int) -> Epoch | None:
    """The tenant's epoch and hold (one round trip), or None when the cache cannot be read (then
    nothing may be reused)."""
    from django.core.cache import cache

    at = time.monotonic()
    try:
        reader = _redis_reader()
        if reader is None:
            found = cache.get_many([key(tenant_id), hold_key(tenant_id)])
            return Epoch(found.get(key(tenant_id), 0), hold_key(tenant_id) in found, at)
        client, make_key, serializer = reader
        counter, held = client.mget([make_key(key(tenant_id)), make_key(hold_key(tenant_id))])
        return Epoch(0 if counter is None else serializer.loads(counter), held is not None, at)
    except Exception:
        return None


def hold(tenant_id: int) -> bool:
    """Put the tenant on hold for HOLD_S (before the change that needs it commits). False when the
    cache could not be written: the caller then waits MAX_AGE_S after its commit instead. On the
    local-memory cache (embedded mode) the hold is this process' — embedded mode's one web
    process, the only one that authenticates."""
    from django.core.cache import cache

    try:
        cache.set(hold_key(tenant_id), 1, timeout=HOLD_S)
    except Exception:
        log.warning("tenant %s: the hold could not be set; the change will wait out MAX_AGE_S", tenant_id)
        return False
    return True


def bump(tenant_id: int) -> None:
    from django.core.cache import cache

    if not cache.add(key(tenant_id), 1, timeout=None):
        cache.incr(key(tenant_id))


def bump_after_commit(tenant_id: int, description: str = "tenant epoch bump") -> None:
    """Move the tenant's epoch once the current transaction commits (at once outside one)."""
    after_commit(description, lambda: bump(tenant_id))
