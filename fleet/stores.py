"""Where the gate's counters live: one atomic check-and-debit across every matching limit.

- `RedisStore`: one Lua script checks every counter and debits all of them or none, on the
  server's clock (`TIME`). Every key of a tenant carries the hash tag `{t<id>}`, so the script runs
  unchanged on Redis Cluster (all keys in one slot). Redis is a cache of the ledger: when its
  `ready` marker is missing (flushed, restarted empty, never used) the state is rebuilt from the
  allowed `GateDecision` rows before anything is allowed.
- `DatabaseStore`: the same rules on the database, serialised per tenant by locking the tenant's
  `FleetLock` row (SQLite runs `BEGIN IMMEDIATE`, so there the whole database serialises).

Both return an `Outcome`; a store that cannot be read raises `StoreUnavailable`, which the gate
turns into a refusal (`limit_store_unavailable`), never an allow.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django.db import transaction
from django.db.models import F

from fleet.gate import BUCKETS, Debit
from fleet.models import FleetLock, LimitCounter, RateState


class StoreUnavailable(Exception):
    """The limit store could not be read or written: the gate must refuse."""


@dataclass(frozen=True)
class Outcome:
    allowed: bool
    duplicate_of: str | None = None  # a decision id recorded under this idempotency key
    failed: Debit | None = None  # the first limit that refused
    used: int = 0  # what the refusing counter already held (units or calls)
    retry_after_ms: int | None = None  # None: waiting will not help (the call exceeds the cap)
    now_ms: int = 0
    # time.monotonic() just before the debit was sent: how long its ledger row has taken since
    debited_at: float = 0.0


class LimitStore(Protocol):
    def check_and_debit(
        self,
        tenant_id: int,
        debits: Sequence[Debit],
        *,
        idempotency_key: str,
        decision_id: str,
        tag: str | None = None,
    ) -> Outcome: ...


# --------------------------------------------------------------------------------------------- Redis

_CHECK_AND_DEBIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prior = redis.call('GET', KEYS[1])
if prior then return {'dup', prior} end
if redis.call('EXISTS', KEYS[2]) == 0 then return {'cold'} end
local buckets = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local plan = {}
for i = 1, n do
  local base = 4 + (i - 1) * 4
  local kind, amount = ARGV[base + 1], tonumber(ARGV[base + 2])
  local cap, window = tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
  local key = KEYS[2 + i]
  if kind == 'b' then
    local width = math.max(1, math.ceil(window / buckets))
    local idx = math.floor(now / width)
    local fields = {}
    for j = idx - buckets, idx do fields[#fields + 1] = tostring(j) end
    local vals = redis.call('HMGET', key, unpack(fields))
    local used = 0
    for _, v in ipairs(vals) do if v then used = used + tonumber(v) end end
    if used + amount > cap then
      local retry = -1
      if amount <= cap then
        local freed = 0
        for j = 1, #vals do
          if vals[j] then freed = freed + tonumber(vals[j]) end
          if used - freed + amount <= cap then
            retry = (idx - buckets + j - 1 + buckets + 1) * width - now
            break
          end
        end
      end
      return {'deny', i, tostring(used), tostring(retry), tostring(now)}
    end
    plan[i] = {key, 'b', tostring(idx), amount, window + 2 * width, idx - buckets}
  else
    local interval = window / cap
    local tat = tonumber(redis.call('GET', key) or '0')
    if tat < now then tat = now end
    if tat - now > window - interval + 0.0001 then
      return {'deny', i, tostring(cap), tostring(math.ceil(tat - now - (window - interval))), tostring(now)}
    end
    plan[i] = {key, 'r', tat + interval}
  end
end
for i = 1, n do
  local p = plan[i]
  if p[2] == 'b' then
    redis.call('HINCRBY', p[1], p[3], p[4])
    redis.call('PEXPIRE', p[1], p[5])
    if redis.call('HLEN', p[1]) > 2 * (buckets + 1) then
      for _, f in ipairs(redis.call('HKEYS', p[1])) do
        if tonumber(f) < p[6] then redis.call('HDEL', p[1], f) end
      end
    end
  else
    redis.call('SET', p[1], string.format('%.4f', p[3]), 'PX', math.ceil(p[3] - now) + 1000)
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {'ok', tostring(now)}
"""

# Rebuild, phase 1: claim the rebuild (or learn that the store is ready / being rebuilt).
_BEGIN_REBUILD = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {'ready'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('SET', KEYS[2], tostring(now), 'NX', 'PX', ARGV[1]) then return {'claimed', tostring(now)} end
return {'busy'}
"""

# Rebuild, phase 2: write the counters read from the ledger and open the store, all at once.
# ARGV: n_hashes, then per hash: field count, ttl ms, field, value, ...; then n_strings, then per
# string: value, ttl ms. KEYS: marker, fence, hash keys..., string keys...
_FINISH_REBUILD = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 'lost' end
local a = 2
local k = 3
local nh = tonumber(ARGV[a]); a = a + 1
for _ = 1, nh do
  local nf, ttl = tonumber(ARGV[a]), tonumber(ARGV[a + 1]); a = a + 2
  redis.call('DEL', KEYS[k])
  for _ = 1, nf do redis.call('HSET', KEYS[k], ARGV[a], ARGV[a + 1]); a = a + 2 end
  if nf > 0 then redis.call('PEXPIRE', KEYS[k], ttl) end
  k = k + 1
end
local ns = tonumber(ARGV[a]); a = a + 1
for _ = 1, ns do
  redis.call('SET', KEYS[k], ARGV[a], 'PX', ARGV[a + 1]); a = a + 2
  k = k + 1
end
redis.call('SET', KEYS[1], '1')
redis.call('DEL', KEYS[2])
return 'ok'
"""

# How long a rebuild waits before reading the ledger: every gate call that debited the lost
# state has by then committed its ledger row or given up (`RedisStore.commit_deadline_ms`), so the
# rebuild cannot miss an authorisation that is still on its way to the ledger.
REBUILD_FENCE_MS = 2_000
IDEMPOTENCY_TTL_MS = 7 * 24 * 3600 * 1000


def tenant_tag(tenant_id: int) -> str:
    return f"t{tenant_id}"


def marker_key(tag: str) -> str:
    return f"sp:{{{tag}}}:ready"


def fence_key(tag: str) -> str:
    return f"sp:{{{tag}}}:rebuilding"


def idempotency_redis_key(tag: str, idempotency_key: str) -> str:
    return f"sp:{{{tag}}}:idem:{idempotency_key}"


@dataclass(frozen=True)
class LedgerEntry:
    """An allowed decision, as the rebuild needs it."""

    decision_id: str
    idempotency_key: str
    decided_ms: int
    debits: Sequence[dict[str, Any]]


class RedisStore:
    # A gate call that debited Redis must commit its ledger row within this long, or refuse.
    commit_deadline_ms = REBUILD_FENCE_MS // 2

    def __init__(self, client: Any, ledger: Callable[[int, int], Sequence[LedgerEntry]]) -> None:
        """`client`: a redis-py client (or cluster client); `ledger(tenant_id, since_ms)`: the
        tenant's allowed decisions since then, for rebuilds."""
        self.client = client
        self.ledger = ledger
        self.fence_ms = REBUILD_FENCE_MS
        self._check = client.register_script(_CHECK_AND_DEBIT)
        self._begin = client.register_script(_BEGIN_REBUILD)
        self._finish = client.register_script(_FINISH_REBUILD)

    def check_and_debit(
        self,
        tenant_id: int,
        debits: Sequence[Debit],
        *,
        idempotency_key: str,
        decision_id: str,
        tag: str | None = None,
    ) -> Outcome:
        """`tag`: the tenant's hash tag (`fleet.services.gate_tag`), the same in every key."""
        tag = tag or tenant_tag(tenant_id)
        keys = [idempotency_redis_key(tag, idempotency_key), marker_key(tag)]
        args: list[Any] = [decision_id, IDEMPOTENCY_TTL_MS, BUCKETS, len(debits)]
        for debit in debits:
            keys.append(debit.key)
            args += ["b" if debit.kind == "budget" else "r", debit.amount, debit.cap, debit.window_ms]
        for _attempt in range(3):
            sent_at = time.monotonic()
            try:
                reply = self._check(keys=keys, args=args)
            except Exception as exc:  # any client or server error: the store cannot be read
                raise StoreUnavailable(f"redis: {type(exc).__name__}") from exc
            status = _text(reply[0])
            if status == "cold":
                if not self.rebuild(tenant_id, tag=tag):
                    self.await_rebuild(tag)
                continue
            if status == "dup":
                return Outcome(allowed=True, duplicate_of=_text(reply[1]))
            if status == "ok":
                return Outcome(allowed=True, now_ms=int(_text(reply[1])), debited_at=sent_at)
            index, used, retry, now = (
                int(reply[1]),
                int(float(_text(reply[2]))),
                int(_text(reply[3])),
                reply[4],
            )
            return Outcome(
                allowed=False,
                failed=debits[index - 1],
                used=used,
                retry_after_ms=None if retry < 0 else retry,
                now_ms=int(_text(now)),
            )
        raise StoreUnavailable("redis: the limit state is being rebuilt")

    def make_ready(self, tenants: Sequence[tuple[int, str]]) -> None:
        """Raise unless Redis answers; then have the counters of `tenants` (id, tag) ready: rebuilt
        from the ledger where Redis came back empty, behind one fence for all of them, or waited
        for where another process is at it. (`core.availability` probes an unreachable
        store with this, refusing every call meanwhile.)"""
        self.client.ping()
        for (_, tag), ready in zip(tenants, self.rebuild_many(tenants), strict=True):
            if not ready:
                self.await_rebuild(tag)

    def await_rebuild(self, tag: str) -> None:
        """Another process is rebuilding: wait (bounded) for its marker rather than refuse at once."""
        deadline = time.monotonic() + 2 * self.fence_ms / 1000 + 1
        while time.monotonic() < deadline:
            try:
                if self.client.exists(marker_key(tag)):
                    return
            except Exception as exc:
                raise StoreUnavailable(f"redis: {type(exc).__name__}") from exc
            time.sleep(0.05)

    def rebuild(self, tenant_id: int, *, force: bool = False, tag: str | None = None) -> bool:
        """Rebuild the tenant's counters from the ledger; False when another process is at it.
        `force` rebuilds a store that looks ready (an operator's `rebuild_limits`): removing the
        marker first makes every concurrent call wait for the rebuilt state (they refuse)."""
        return self.rebuild_many([(tenant_id, tag or tenant_tag(tenant_id))], force=force)[0]

    def rebuild_many(self, tenants: Sequence[tuple[int, str]], *, force: bool = False) -> list[bool]:
        """`rebuild` for each (tenant id, tag), behind one fence for all of them (a Redis that came
        back empty is rebuilt for every tenant a process served in one fence's time, not one per
        tenant). True for a tenant whose store is ready (already, or rebuilt here)."""
        fence_ms = self.fence_ms
        done: list[bool] = []
        claims: list[tuple[int, int, str, str]] = []  # (index, tenant id, tag, token)
        try:
            for index, (tenant_id, tag) in enumerate(tenants):
                if force:
                    self.client.delete(marker_key(tag))
                claim = self._begin(keys=[marker_key(tag), fence_key(tag)], args=[fence_ms * 10])
                done.append(_text(claim[0]) == "ready")
                if _text(claim[0]) == "claimed":
                    claims.append((index, tenant_id, tag, _text(claim[1])))
            if not claims:
                return done
            # Let every call that debited the lost state finish writing its ledger row first.
            time.sleep(fence_ms / 1000)
            for index, tenant_id, tag, token in claims:
                done[index] = self._finish_rebuild(tenant_id, tag, token)
            return done
        except StoreUnavailable:
            raise
        except Exception as exc:
            raise StoreUnavailable(f"redis rebuild: {type(exc).__name__}") from exc

    def _finish_rebuild(self, tenant_id: int, tag: str, token: str) -> bool:
        hashes, strings = _rebuilt_state(tenant_id, tag, self.ledger, int(token) + self.fence_ms)
        keys = [marker_key(tag), fence_key(tag), *hashes, *strings]
        args: list[Any] = [token, len(hashes)]
        for fields, ttl in hashes.values():
            args += [len(fields), ttl]
            for field, units in fields.items():
                args += [field, units]
        args.append(len(strings))
        for text, ttl in strings.values():
            args += [text, ttl]
        return _text(self._finish(keys=keys, args=args)) == "ok"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _rebuilt_state(
    tenant_id: int, tag: str, ledger: Callable[[int, int], Sequence[LedgerEntry]], now_ms: int
) -> tuple[dict[str, tuple[dict[str, int], int]], dict[str, tuple[str, int]]]:
    """(budget hashes: key → (bucket → units, ttl), strings: key → (value, ttl)) from the ledger.
    Rate limits come back as if every call in the window had just been made (a later TAT than
    the lost one, never an earlier one), so a rebuild can only refuse more, never allow more."""
    entries = ledger(tenant_id, now_ms - 2 * 24 * 3600 * 1000)
    hashes: dict[str, tuple[dict[str, int], int]] = {}
    rates: dict[str, tuple[int, int, int]] = {}  # key → (calls in window, cap, window)
    strings: dict[str, tuple[str, int]] = {}
    for entry in entries:
        strings[idempotency_redis_key(tag, entry.idempotency_key)] = (
            entry.decision_id,
            IDEMPOTENCY_TTL_MS,
        )
        for debit in entry.debits:
            window = int(debit["window_ms"])
            if now_ms - entry.decided_ms > window + 2 * max(1, math.ceil(window / BUCKETS)):
                continue
            if debit["kind"] == "budget":
                width = max(1, math.ceil(window / BUCKETS))
                fields, _ = hashes.setdefault(debit["key"], ({}, window + 2 * width))
                bucket = str(entry.decided_ms // width)
                fields[bucket] = fields.get(bucket, 0) + int(debit["amount"])
            elif now_ms - entry.decided_ms <= window:
                calls, cap, _ = rates.get(debit["key"], (0, int(debit["cap"]), window))
                rates[debit["key"]] = (calls + 1, cap, window)
    for key, (calls, cap, window) in rates.items():
        tat = now_ms + min(calls, cap) * (window / cap)
        strings[key] = (f"{tat:.4f}", math.ceil(tat - now_ms) + 1000)
    return hashes, strings


# ------------------------------------------------------------------------------------------ database


class DatabaseStore:
    """Check-and-debit in the caller's transaction, serialised by the tenant's FleetLock row."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock

    def check_and_debit(
        self,
        tenant_id: int,
        debits: Sequence[Debit],
        *,
        idempotency_key: str,
        decision_id: str,
        tag: str | None = None,
    ) -> Outcome:
        # The idempotency key is the ledger's unique constraint (checked by the caller under the
        # same lock), so this store has no key of its own.
        # No savepoint of its own inside the caller's transaction: a refusal writes nothing (every
        # write runs after every check), and an error rolls the caller's transaction back anyway.
        with transaction.atomic(savepoint=False):
            # The lock row exists after a tenant's first call: one statement then, not two.
            if FleetLock.objects.select_for_update().filter(tenant_id=tenant_id).first() is None:
                FleetLock.objects.bulk_create([FleetLock(tenant_id=tenant_id)], ignore_conflicts=True)
                FleetLock.objects.select_for_update().get(tenant_id=tenant_id)
            now_ms = int(self.clock() * 1000)
            plan: list[Callable[[], None]] = []
            for debit in debits:
                if debit.kind == "budget":
                    refusal, action = self._budget(tenant_id, debit, now_ms)
                else:
                    refusal, action = self._rate(tenant_id, debit, now_ms)
                if refusal is not None:
                    return refusal
                plan.append(action)
            for action in plan:
                action()
            return Outcome(allowed=True, now_ms=now_ms)

    def _budget(self, tenant_id: int, debit: Debit, now_ms: int) -> tuple[Outcome | None, Callable[[], None]]:
        width = debit.bucket_ms
        idx = now_ms // width
        rows = dict(
            LimitCounter.objects.filter(key=debit.key, bucket__gte=idx - BUCKETS).values_list(
                "bucket", "amount"
            )
        )
        used = sum(rows.values())
        if used + debit.amount > debit.cap:
            retry: int | None = None
            if debit.amount <= debit.cap:
                freed = 0
                for bucket in range(idx - BUCKETS, idx + 1):
                    freed += rows.get(bucket, 0)
                    if used - freed + debit.amount <= debit.cap:
                        retry = (bucket + BUCKETS + 1) * width - now_ms
                        break
            return Outcome(False, failed=debit, used=used, retry_after_ms=retry, now_ms=now_ms), _nothing

        def debit_it() -> None:
            updated = LimitCounter.objects.filter(key=debit.key, bucket=idx).update(
                amount=F("amount") + debit.amount
            )
            if not updated:
                LimitCounter.objects.create(
                    tenant_id=tenant_id, key=debit.key, bucket=idx, amount=debit.amount
                )
            LimitCounter.objects.filter(key=debit.key, bucket__lt=idx - BUCKETS).delete()

        return None, debit_it

    def _rate(self, tenant_id: int, debit: Debit, now_ms: int) -> tuple[Outcome | None, Callable[[], None]]:
        interval = debit.window_ms / debit.cap
        state = RateState.objects.filter(key=debit.key).first()
        tat = max(state.tat_ms if state else 0.0, float(now_ms))
        if tat - now_ms > debit.window_ms - interval + 0.0001:
            retry = math.ceil(tat - now_ms - (debit.window_ms - interval))
            return Outcome(False, failed=debit, used=debit.cap, retry_after_ms=retry, now_ms=now_ms), _nothing

        def debit_it() -> None:
            # Under the tenant's lock nobody else writes this key: update, or create its first
            # state (update_or_create cost a savepoint, a locking read and its release besides).
            if not RateState.objects.filter(key=debit.key).update(tat_ms=tat + interval):
                RateState.objects.create(tenant_id=tenant_id, key=debit.key, tat_ms=tat + interval)

        return None, debit_it


def _nothing() -> None:
    return None
