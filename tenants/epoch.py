"""A tenant's change epoch: one counter in the shared cache (Redis in production) that every change
a per-process cache depends on moves once it commits — fleet policies, halts and quarantines,
approval policies, API key revocations.

Hot paths (the gate, API-key authentication) keep per-process copies of what they read from the
database and reuse a copy only while the epoch still reads as it did when the copy was made: one
cache GET, instead of the queries the copy saves. Because the bump runs when the change commits,
before its API call answers, the next call anywhere sees the change.

What the counter cannot promise, a bound covers: a bump that failed (the cache unreachable just
then) or a per-process cache (embedded mode's locmem) is caught up by `MAX_AGE_S` — no copy is
reused for longer than that, whatever the counter says. A cache that cannot be read means no copy
is reused at all (`read` answers None).
"""

from __future__ import annotations

from typing import Any

from controlplane.postcommit import after_commit

# No per-process copy is reused longer than this, whatever the counter says.
MAX_AGE_S = 1.0


def key(tenant_id: int) -> str:
    # The fleet status long-poll waits on this key too (its historical name).
    return f"fleet:version:{tenant_id}"


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


def read(tenant_id: int) -> Any:
    """The tenant's epoch, or None when the cache cannot be read (then nothing may be reused)."""
    from django.core.cache import cache

    try:
        reader = _redis_reader()
        if reader is None:
            return cache.get(key(tenant_id), 0)
        client, make_key, serializer = reader
        value = client.get(make_key(key(tenant_id)))
        return 0 if value is None else serializer.loads(value)
    except Exception:
        return None


def bump(tenant_id: int) -> None:
    from django.core.cache import cache

    if not cache.add(key(tenant_id), 1, timeout=None):
        cache.incr(key(tenant_id))


def bump_after_commit(tenant_id: int, description: str = "tenant epoch bump") -> None:
    """Move the tenant's epoch once the current transaction commits (at once outside one)."""
    after_commit(description, lambda: bump(tenant_id))
