"""Where circuit breakers' outcomes are counted: in the gate's limit store (`fleet.stores`), Redis
when the gate uses Redis, else the database. One call adds one batch of a breaker's outcomes and
answers its `Tally` (one round trip on Redis: a Lua script on the server's clock).

A generation's counts (`gate.BreakerSpec.generation`) live under their own keys: a closed breaker
starts from nothing. The window is kept in `BUCKETS` buckets of window/BUCKETS each, and the last
BUCKETS of them are summed (between window − one bucket and the window): the counts are an
approximation of the window, which may open a breaker up to one bucket's time later or earlier
than an exact window would. Redis' counts are not rebuilt after it comes back empty: a breaker
then counts from nothing again (it opens later, never wrongly).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from django.db import transaction

from fleet.gate import BreakerSpec, Tally
from fleet.models import BreakerTally
from fleet.stores import LimitStore, RedisStore, StoreUnavailable

BUCKETS = 20
RUN_TTL_MS = 7 * 24 * 3600 * 1000  # a run of failures nobody added to for a week is forgotten


def counts_key(tag: str, spec: BreakerSpec) -> str:
    return f"sp:{{{tag}}}:cb:{spec.id}:{spec.generation}"


def bucket_ms(spec: BreakerSpec) -> int:
    return max(1, math.ceil(spec.window_s * 1000 / BUCKETS))


class BreakerCounts(Protocol):
    def add(self, tenant_id: int, tag: str, spec: BreakerSpec, failures: Sequence[bool]) -> Tally:
        """Add outcomes (True: a failure) in their order; raises StoreUnavailable."""
        ...


def counts_for(store: LimitStore) -> BreakerCounts:
    """The counter beside the gate's store: the same Redis client, or the database."""
    if isinstance(store, RedisStore):
        return RedisCounts(store.client)
    return DatabaseCounts()


# --------------------------------------------------------------------------------------------- Redis

# KEYS: the run of failures, the window's hash. ARGV: bucket width (ms), buckets, outcomes ("FS..").
_ADD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local width, n, outcomes = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local idx = math.floor(now / width)
local run = tonumber(redis.call('GET', KEYS[1]) or '0')
local peak, calls, fails = run, 0, 0
for i = 1, #outcomes do
  calls = calls + 1
  if string.sub(outcomes, i, i) == 'F' then
    run = run + 1
    fails = fails + 1
    if run > peak then peak = run end
  else
    run = 0
  end
end
redis.call('SET', KEYS[1], tostring(run), 'PX', ARGV[4])
redis.call('HINCRBY', KEYS[2], 'c' .. idx, calls)
if fails > 0 then redis.call('HINCRBY', KEYS[2], 'f' .. idx, fails) end
redis.call('PEXPIRE', KEYS[2], (n + 2) * width)
local fields = {}
for j = idx - n + 1, idx do
  fields[#fields + 1] = 'c' .. j
  fields[#fields + 1] = 'f' .. j
end
local vals = redis.call('HMGET', KEYS[2], unpack(fields))
local c, f = 0, 0
for j = 1, #vals, 2 do
  c = c + tonumber(vals[j] or '0')
  f = f + tonumber(vals[j + 1] or '0')
end
if redis.call('HLEN', KEYS[2]) > 4 * n + 4 then
  for _, k in ipairs(redis.call('HKEYS', KEYS[2])) do
    if tonumber(string.sub(k, 2)) <= idx - n then redis.call('HDEL', KEYS[2], k) end
  end
end
return {peak, c, f}
"""


class RedisCounts:
    def __init__(self, client: Any) -> None:
        self._add = client.register_script(_ADD)

    def add(self, tenant_id: int, tag: str, spec: BreakerSpec, failures: Sequence[bool]) -> Tally:
        key = counts_key(tag, spec)
        outcomes = "".join("F" if failed else "S" for failed in failures)
        try:
            peak, calls, fails = self._add(
                keys=[f"{key}:run", f"{key}:window"], args=[bucket_ms(spec), BUCKETS, outcomes, RUN_TTL_MS]
            )
        except Exception as exc:  # any client or server error: nothing counted
            raise StoreUnavailable(f"redis: {type(exc).__name__}") from exc
        return Tally(int(peak), int(calls), int(fails))


# ------------------------------------------------------------------------------------------ database


class DatabaseCounts:
    """The same counts in one `BreakerTally` row per generation, locked while it is added to."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock

    def add(self, tenant_id: int, tag: str, spec: BreakerSpec, failures: Sequence[bool]) -> Tally:
        key = counts_key(tag, spec)
        width = bucket_ms(spec)
        idx = int(self.clock() * 1000) // width
        with transaction.atomic():
            row = BreakerTally.objects.select_for_update().filter(key=key).first()
            if row is None:
                BreakerTally.objects.bulk_create(
                    [BreakerTally(tenant_id=tenant_id, key=key)], ignore_conflicts=True
                )
                row = BreakerTally.objects.select_for_update().get(key=key)
            run = peak = row.consecutive
            for failed in failures:
                run = run + 1 if failed else 0
                peak = max(peak, run)
            buckets = {int(b): v for b, v in row.buckets.items() if int(b) > idx - BUCKETS}
            calls, fails = buckets.get(idx, [0, 0])
            buckets[idx] = [calls + len(failures), fails + sum(failures)]
            row.consecutive, row.buckets = run, {str(b): v for b, v in buckets.items()}
            row.save(update_fields=["consecutive", "buckets"])
        return Tally(peak, sum(c for c, _ in buckets.values()), sum(f for _, f in buckets.values()))
