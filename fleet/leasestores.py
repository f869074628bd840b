"""Leases in the limit stores: grant budget units ahead of calls, give back what was not used.

A grant moves every counter the lease covers at once, all or none, by a whole number of calls'
amounts between `minimum` (one call's) and `want` units, and never past what is left divided by
`SHARE` (so a lease
takes at most a share of what is left, and when even one call's amount is more than that the
grant is refused: the caller decides per call, and a small budget stays exact). What a grant
debits sits in the counters like any allowed call's debit, so spent + every outstanding lease
never exceeds a cap. A give-back subtracts the unused units from the bucket the grant was
debited to, once (a key of its own in Redis; the lease row's state under its lock in the
database), and never below zero; an overrun (more used than granted) is added there instead.

Redis keeps its own clock (`TIME`) as the gate does, and the same `ready` marker: a give-back to
a store being rebuilt is dropped (the rebuild reads the ledger, which holds what the lease
counts), and a grant to one refuses until it is ready.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import F, Sum

from fleet.gate import BUCKETS, Debit
from fleet.models import FleetLock, LimitCounter
from fleet.stores import (
    IDEMPOTENCY_TTL_MS,
    DatabaseStore,
    LimitStore,
    RedisStore,
    StoreUnavailable,
    idempotency_redis_key,
    marker_key,
)

_GRANT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prior = redis.call('GET', KEYS[1])
if prior then return {'dup', prior} end
if redis.call('EXISTS', KEYS[2]) == 0 then return {'cold'} end
local buckets, n, share = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local plan = {}
for i = 1, n do
  local base = 5 + (i - 1) * 4
  local want, least = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local cap, window = tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
  local key = KEYS[2 + i]
  local width = math.max(1, math.ceil(window / buckets))
  local idx = math.floor(now / width)
  local fields = {}
  for j = idx - buckets, idx do fields[#fields + 1] = tostring(j) end
  local used = 0
  for _, v in ipairs(redis.call('HMGET', key, unpack(fields))) do if v then used = used + tonumber(v) end end
  local granted = math.min(want, math.floor(math.max(0, cap - used) / share))
  if least > 0 then granted = math.floor(granted / least) * least end
  if granted < least or used + granted > cap then return {'short', i, tostring(used), tostring(now)} end
  plan[i] = {key, tostring(idx), granted, window + 2 * width, idx - buckets}
end
local answer = {'ok', tostring(now)}
for i = 1, n do
  local p = plan[i]
  if p[3] > 0 then
    redis.call('HINCRBY', p[1], p[2], p[3])
    redis.call('PEXPIRE', p[1], p[4])
  end
  answer[#answer + 1] = tostring(p[3])
  answer[#answer + 1] = p[2]
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return answer
"""

_GIVE_BACK = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 'cold' end
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then return 'dup' end
for i = 1, tonumber(ARGV[2]) do
  local field, units = ARGV[1 + 2 * i], tonumber(ARGV[2 + 2 * i])
  local held = tonumber(redis.call('HGET', KEYS[2 + i], field) or '0')
  if units > 0 then
    local back = math.min(units, held)
    if back > 0 then redis.call('HINCRBY', KEYS[2 + i], field, -back) end
  elseif units < 0 and redis.call('EXISTS', KEYS[2 + i]) == 1 then
    redis.call('HINCRBY', KEYS[2 + i], field, -units)  -- an overrun: counted, never refused
  end
end
return 'ok'
"""

# A lease takes at most this share of what is left of each budget it covers (1/SHARE of it).
SHARE = 4


@dataclass(frozen=True)
class Grant:
    status: str  # "ok" | "short" (not even one call's amount within the share) | "dup"
    amounts: tuple[int, ...] = ()  # units granted, one per debit
    buckets: tuple[int, ...] = ()  # the bucket each was debited to
    now_ms: int = 0
    duplicate_of: str = ""
    short: Debit | None = None
    debited_at: float = 0.0  # time.monotonic() just before the grant was sent


def lease_key(lease_id: str) -> str:
    return f"lease:{lease_id}"


def grant(
    store: LimitStore,
    tenant_id: int,
    tag: str,
    lease_id: str,
    wants: Sequence[Debit],
    minimums: Sequence[int],
) -> Grant:
    """Debit between minimums[i] and wants[i].amount units of each budget, all or none."""
    if isinstance(store, RedisStore):
        return _redis_grant(store, tag, lease_id, wants, minimums)
    if isinstance(store, DatabaseStore):
        return _database_grant(store, tenant_id, wants, minimums)
    raise StoreUnavailable(f"{type(store).__name__} grants no leases")


def give_back(
    store: LimitStore,
    tag: str,
    lease_id: str,
    debits: Sequence[Debit],
    buckets: Sequence[int],
    unused: Sequence[int],
) -> None:
    """Subtract `unused[i]` from debit i's counter in bucket `buckets[i]`, or add it when negative
    (an overrun: more was used than granted), once per lease (the database store's caller holds
    the lease row's lock in its transaction). A counter gone with its window is left alone."""
    if isinstance(store, RedisStore):
        script = store.client.register_script(_GIVE_BACK)
        keys = [marker_key(tag), idempotency_redis_key(tag, lease_key(lease_id) + ":back")]
        args: list[object] = [IDEMPOTENCY_TTL_MS, len(debits)]
        for debit, bucket, units in zip(debits, buckets, unused, strict=True):
            keys.append(debit.key)
            args += [str(bucket), units]
        try:
            script(keys=keys, args=args)
        except Exception as exc:  # what is not given back stays counted: erring toward refusal
            raise StoreUnavailable(f"redis: {type(exc).__name__}") from exc
        return
    for debit, bucket, units in zip(debits, buckets, unused, strict=True):
        if units > 0:
            LimitCounter.objects.filter(key=debit.key, bucket=bucket, amount__gte=units).update(
                amount=F("amount") - units
            )
        elif units < 0:
            LimitCounter.objects.filter(key=debit.key, bucket=bucket).update(amount=F("amount") - units)


def _redis_grant(
    store: RedisStore, tag: str, lease_id: str, wants: Sequence[Debit], minimums: Sequence[int]
) -> Grant:
    script = store.client.register_script(_GRANT)
    keys = [idempotency_redis_key(tag, lease_key(lease_id)), marker_key(tag)]
    args: list[object] = [lease_id, IDEMPOTENCY_TTL_MS, BUCKETS, len(wants), SHARE]
    for debit, least in zip(wants, minimums, strict=True):
        keys.append(debit.key)
        args += [debit.amount, least, debit.cap, debit.window_ms]
    tenant_id = int(tag[1:].partition(".")[0])  # gate_tag's form
    for _attempt in range(3):
        sent_at = time.monotonic()
        try:
            reply = [_text(v) for v in script(keys=keys, args=args)]
        except Exception as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}") from exc
        if reply[0] == "cold":
            if not store.rebuild(tenant_id, tag=tag):
                store.await_rebuild(tag)
            continue
        if reply[0] == "dup":
            return Grant("dup", duplicate_of=reply[1])
        if reply[0] == "short":
            return Grant("short", short=wants[int(reply[1]) - 1], now_ms=int(reply[3]))
        pairs = reply[2:]
        return Grant(
            "ok",
            amounts=tuple(int(v) for v in pairs[0::2]),
            buckets=tuple(int(v) for v in pairs[1::2]),
            now_ms=int(reply[1]),
            debited_at=sent_at,
        )
    raise StoreUnavailable("redis: the limit state is being rebuilt")


def _database_grant(
    store: DatabaseStore, tenant_id: int, wants: Sequence[Debit], minimums: Sequence[int]
) -> Grant:
    """In the caller's transaction (the tenant's), under the tenant's FleetLock as every debit."""
    if FleetLock.objects.select_for_update().filter(tenant_id=tenant_id).first() is None:
        FleetLock.objects.bulk_create([FleetLock(tenant_id=tenant_id)], ignore_conflicts=True)
        FleetLock.objects.select_for_update().get(tenant_id=tenant_id)
    now_ms = int(store.clock() * 1000)
    planned: list[tuple[int, int]] = []
    for debit, least in zip(wants, minimums, strict=True):
        idx = now_ms // debit.bucket_ms
        used = (
            LimitCounter.objects.filter(key=debit.key, bucket__gte=idx - BUCKETS).aggregate(s=Sum("amount"))[
                "s"
            ]
            or 0
        )
        granted = min(debit.amount, math.floor(max(0, debit.cap - used) / SHARE))
        if least > 0:
            granted = granted // least * least  # whole calls: no unit stranded in a lease
        if granted < least or used + granted > debit.cap:
            return Grant("short", short=debit, now_ms=now_ms)
        planned.append((granted, idx))
    for debit, (granted, idx) in zip(wants, planned, strict=True):
        if granted and not LimitCounter.objects.filter(key=debit.key, bucket=idx).update(
            amount=F("amount") + granted
        ):
            LimitCounter.objects.create(tenant_id=tenant_id, key=debit.key, bucket=idx, amount=granted)
    return Grant(
        "ok",
        amounts=tuple(g for g, _ in planned),
        buckets=tuple(i for _, i in planned),
        now_ms=now_ms,
    )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
