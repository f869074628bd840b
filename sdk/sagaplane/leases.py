"""Budget leases held in process (ARCHITECTURE §8.3, leases): decisions at the speed of a call.

A `LeaseHolder` keeps, per tool and agent, the budget units the control plane granted ahead of
calls (`POST /api/v1/gate/leases`). A call the lease covers — the same tool and agent, the same
values of the arguments its budgets are kept per, each budget's counted argument an amount that
fits what is left of the grant — is allowed here, without a round trip; the caller records it in
the WAL (GATE_ALLOW naming the lease and what it took) before the effect, as any allow.

Fail closed: a lease is used only until its TTL, counted on this process' monotonic clock from the
moment its grant was *sent* (so never past the server's own expiry); a lease that could not be
renewed is gone, and the call goes to the per-call gate, which refuses when it cannot be reached.
The holder gives a lease back with what it used when it is renewed (one round trip: the renewal
carries the return), when the fleet state changes (a halt, a limit change, a quarantine: `revoke`),
and at close. A grant answered `per_call` (an approval policy, a rate limit, a halt, too little
left...) sends that tool's calls per call for one TTL before a lease is asked again.

Sizes follow demand: a lease asks for twice the calls the key made in the last TTL (at least one,
at most `MAX_CALLS`); the server grants at most a share of what is left.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

from .client import Client, TransportError
from .names import name_key

SCALE = 10_000  # the gate's units (fleet.gate.SCALE)
MAX_CALLS = 1_000
MARGIN_S = 0.05  # a lease is not used in its last 50 ms (the server's expiry is later still)


def to_units(value: Any) -> int | None:
    """As the gate counts an amount (fleet.gate.to_units); None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        return None
    try:
        number = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    except (InvalidOperation, ValueError):
        return None
    if not number.is_finite() or number < 0 or number > 10**11:
        return None
    return int((number * SCALE).to_integral_value(rounding=ROUND_CEILING))


def _units(text: Any) -> int:
    return to_units(Decimal(str(text))) or 0


@dataclass
class _Limit:
    name: str
    argument: str
    granted: int
    used: int = 0


@dataclass
class Lease:
    lease_id: str
    limits: list[_Limit]
    scope: dict[str, str]  # argument name → canonical JSON of the value it was granted for
    valid_until: float  # monotonic
    renew_after: float


@dataclass
class _Key:
    second: float = 0.0  # the start (monotonic) of the second whose calls `calls` counts
    calls: int = 0
    last_calls: int = 0  # in the second before it
    lease: Lease | None = None
    per_call_until: float = 0.0
    renewing: bool = False  # one renewal at a time; calls meanwhile go per call


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


class LeaseHolder:
    """Thread-safe. `ask` is the client leases are asked of (the gate's own)."""

    def __init__(self, ask: Client, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._ask = ask
        self.clock = clock
        self._keys: dict[tuple[str, str], _Key] = {}
        self._lock = threading.Lock()

    def decide(self, saga_id: str, tool: str, agent: str, args: Mapping[str, Any]) -> dict[str, Any] | None:
        """The allow answer when a held (or newly granted) lease covers the call, else None (ask
        the gate per call)."""
        key = (name_key(tool), name_key(agent))
        now = self.clock()
        with self._lock:
            entry = self._keys.setdefault(key, _Key())
            if now - entry.second >= 1.0:
                entry.last_calls = entry.calls if now - entry.second < 2.0 else 0
                entry.second, entry.calls = now, 0
            entry.calls += 1
            answer = _take(entry.lease, args, now)
            if answer is not None and now < entry.lease.renew_after:  # type: ignore[union-attr]
                return answer
            if answer is None and (now < entry.per_call_until or entry.renewing):
                return None
            old, entry.lease = entry.lease, None  # renewing: no other call uses it meanwhile
            entry.renewing = True
            demand = min(MAX_CALLS, 2 * max(entry.calls, entry.last_calls))
        if answer is not None:
            # This call was decided on the old lease; the renewal carries its use back.
            self._renew(key, saga_id, tool, agent, args, old, demand)
            return answer
        self._renew(key, saga_id, tool, agent, args, old, demand)
        with self._lock:
            return _take(self._keys[key].lease, args, self.clock())

    def _renew(
        self,
        key: tuple[str, str],
        saga_id: str,
        tool: str,
        agent: str,
        args: Mapping[str, Any],
        old: Lease | None,
        demand: int,
    ) -> None:
        body: dict[str, Any] = {
            "lease_id": str(uuid.uuid4()),
            "calls": max(1, demand),
            "saga_id": saga_id,
            "tool": tool,
            "agent": agent,
            "args": dict(args),
        }
        if old is not None:
            body["returns"] = _returning(old)
        sent = self.clock()
        try:
            response = self._ask.post("/api/v1/gate/leases", body)
        except TransportError:
            response = None
        answer = response.body if response is not None and isinstance(response.body, dict) else {}
        with self._lock:
            entry = self._keys.setdefault(key, _Key())
            entry.renewing = False
            if response is None or not response.ok or answer.get("decision") != "lease":
                entry.per_call_until = self.clock() + 1.0
                return
            ttl = float(answer.get("ttl_ms") or 0) / 1000
            entry.lease = Lease(
                lease_id=str(answer["lease_id"]),
                limits=[
                    _Limit(str(lim["limit"]), str(lim["argument"]), _units(lim["granted"]))
                    for lim in answer.get("limits", [])
                ],
                scope={name: _canonical(args.get(name)) for name in answer.get("scope_args", [])},
                valid_until=sent + ttl - MARGIN_S,
                renew_after=sent + ttl / 2,
            )

    def revoke(self) -> None:
        """Drop every lease now (the fleet state changed) and give them back."""
        with self._lock:
            held = [entry.lease for entry in self._keys.values() if entry.lease is not None]
            for entry in self._keys.values():
                entry.lease = None
        for lease in held:
            try:
                self._ask.post(
                    f"/api/v1/gate/leases/{lease.lease_id}/return", {"used": _returning(lease)["used"]}
                )
            except TransportError:
                pass  # the server counts it whole until it is returned; nothing is allowed here


def _take(lease: Lease | None, args: Mapping[str, Any], now: float) -> dict[str, Any] | None:
    """Debit the call from the lease (under the holder's lock) and answer, or None."""
    if lease is None or now >= lease.valid_until:
        return None
    for name, value in lease.scope.items():
        if name not in args or _canonical(args[name]) != value:
            return None
    amounts: list[int] = []
    for limit in lease.limits:
        amount = to_units(args.get(limit.argument)) if limit.argument in args else None
        if amount is None or limit.used + amount > limit.granted:
            return None
        amounts.append(amount)
    for limit, amount in zip(lease.limits, amounts, strict=True):
        limit.used += amount
    debits = {
        limit.name: str(Decimal(amount) / SCALE) for limit, amount in zip(lease.limits, amounts, strict=True)
    }
    return {
        "decision": "allow",
        "authorization_id": lease.lease_id,
        "lease": lease.lease_id,
        "debits": debits,
    }


def _returning(lease: Lease) -> dict[str, Any]:
    return {
        "lease_id": lease.lease_id,
        "used": {limit.name: str(Decimal(limit.used) / SCALE) for limit in lease.limits},
    }
