"""The gate's pure rules: which limits a call meets, what it would debit, and the refusals that
need no store (no I/O here, so every rule is testable on its own).

Amounts are counted in integer units of 1/10,000 (`SCALE`): Redis' Lua numbers are doubles, exact
for integers below 2**53, so an amount or cap is at most `MAX_WHOLE_UNITS` whole units and a sum of
them stays exact. A fraction finer than 1/10,000 is rounded *up*: rounding may only ever refuse.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from functools import cached_property
from typing import Any, Literal

from sagaplane.chain import canonical
from sagaplane.names import glob_matches, name_key, same_name

SCALE = 10_000
MAX_WHOLE_UNITS = 10**11
# A budget's sliding window is counted in BUCKETS buckets of window/BUCKETS each, plus the current
# one: the sum always covers at least the whole window (up to one bucket more), so the
# approximation can only refuse a call that an exact window would allow, never the reverse.
BUCKETS = 60

PER_FIXED = ("agent", "api_key", "tool")
PER_ARG_PREFIX = "arg:"


@dataclass(frozen=True)
class GateRequest:
    saga_id: str
    step_id: str
    tool: str
    args: Mapping[str, Any]
    semantics: str = ""
    agent: str = ""
    tags: tuple[str, ...] = ()
    api_key_prefix: str = ""
    client_idempotency_key: str = ""
    reason: str = ""  # the requester's words for an approver (not part of the call's identity)
    # A reservation (ARCHITECTURE §8.3, reserve then settle): the caller's estimate in units, debited
    # from every budget the call meets instead of its argument, settled later with the real amount.
    reserve: int | None = None

    @cached_property  # (a frozen dataclass without slots: the value lands in the instance's dict)
    def args_digest(self) -> str:
        return hashlib.sha256(canonical(dict(self.args))).hexdigest()

    @cached_property
    def idempotency_key(self) -> str:
        """The same saga, step, tool and arguments (and client key) are the same call: a retry
        gets the first answer and debits nothing more."""
        material = [self.saga_id, self.step_id, self.tool, self.args_digest, self.client_idempotency_key]
        return hashlib.sha256(canonical(material)).hexdigest()


@dataclass(frozen=True)
class LimitSpec:
    """What the gate needs of a BudgetLimit or RateLimit row (decoupled from the ORM)."""

    id: int
    kind: Literal["budget", "rate"]
    name: str
    tool: str
    per: tuple[str, ...]
    window_s: int
    cap_units: int  # budgets: the cap in units; rates: max calls
    argument: str = ""
    on_cap: str = "deny"  # budgets: "deny" or "escalate" (to an approval)


@dataclass(frozen=True)
class Debit:
    """One counter a call would move: `amount` units (budgets) or one call (rates)."""

    key: str
    kind: Literal["budget", "rate"]
    limit: str
    scope: str
    amount: int
    cap: int
    window_ms: int

    @property
    def bucket_ms(self) -> int:
        return max(1, math.ceil(self.window_ms / BUCKETS))

    def as_ledger(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "limit": self.limit,
            "scope": self.scope,
            "amount": self.amount,
            "cap": self.cap,
            "window_ms": self.window_ms,
        }


@dataclass
class InvalidArgument(Exception):
    """A governed call whose argument cannot be counted: refused, never allowed."""

    limit: str
    argument: str
    detail: str
    extra: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.detail


def to_units(value: Any) -> int:
    """A non-negative finite number as integer units of 1/SCALE, rounded up; ValueError otherwise.
    Booleans, strings and containers are not amounts, even when Python could coerce them."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise ValueError(f"must be a number, not {type(value).__name__}")
    try:
        number = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    except (InvalidOperation, ValueError) as exc:
        raise ValueError("must be a number") from exc
    if not number.is_finite():
        raise ValueError("must be finite")
    if number < 0:
        raise ValueError("must not be negative")
    if number > MAX_WHOLE_UNITS:
        raise ValueError(f"must be at most {MAX_WHOLE_UNITS}")
    return int((number * SCALE).to_integral_value(rounding=ROUND_CEILING))


def amount_sent(value: Any) -> Any:
    """An amount as a client sends it: a JSON number, or a decimal string (exact, as answers give
    amounts); `to_units` then refuses what is not a finite non-negative number."""
    if isinstance(value, str) and len(value) <= 40:
        try:
            return Decimal(value)
        except InvalidOperation:
            raise ValueError("must be a number") from None
    return value


def from_units(units: int | float) -> str:
    """Units back to a decimal string for answers (no float rounding on the way out)."""
    return format((Decimal(int(units)) / SCALE).normalize(), "f") if units else "0"


def tool_matches(pattern: str, tool: str) -> bool:
    """Case-insensitive after NFKC, as the SDK matches (sagaplane.names): a caller picks the name."""
    return glob_matches(pattern, tool)


def valid_per(per: Iterable[Any]) -> bool:
    return all(
        isinstance(p, str)
        and (p in PER_FIXED or (p.startswith(PER_ARG_PREFIX) and len(p) > len(PER_ARG_PREFIX)))
        for p in per
    )


def _scope_values(limit: LimitSpec, request: GateRequest) -> list[Any]:
    values: list[Any] = []
    for item in limit.per:
        if item == "agent":
            values.append(request.agent)
        elif item == "api_key":
            values.append(request.api_key_prefix)
        elif item == "tool":
            values.append(request.tool)
        else:
            name = item[len(PER_ARG_PREFIX) :]
            if name not in request.args:
                raise InvalidArgument(
                    limit.name, name, f"argument '{name}' is missing (limit '{limit.name}')"
                )
            values.append(request.args[name])
    return values


def debit_for(limit: LimitSpec, request: GateRequest, *, tenant_tag: str) -> Debit:
    """The counter `limit` keeps for this call (raises InvalidArgument when it cannot count it)."""
    values = _scope_values(limit, request)
    scope = " · ".join(f"{p}={v}" for p, v in zip(limit.per, values, strict=True)) or "fleet"
    # One counter per agent or tool however the caller spells it (the label keeps the spelling).
    counted = [name_key(v) if p in ("agent", "tool") else v for p, v in zip(limit.per, values, strict=True)]
    digest = hashlib.sha256(canonical(counted)).hexdigest()[:24]
    key = f"sp:{{{tenant_tag}}}:{limit.kind[0]}:{limit.id}:{limit.window_s}:{digest}"
    if limit.kind == "rate":
        return Debit(key, "rate", limit.name, scope, 1, limit.cap_units, limit.window_s * 1000)
    if request.reserve is not None:  # the estimate stands for the amount (the call may not name it)
        return Debit(
            key, "budget", limit.name, scope, request.reserve, limit.cap_units, limit.window_s * 1000
        )
    if limit.argument not in request.args:
        raise InvalidArgument(
            limit.name, limit.argument, f"argument '{limit.argument}' is missing (limit '{limit.name}')"
        )
    try:
        amount = to_units(request.args[limit.argument])
    except ValueError as exc:
        raise InvalidArgument(
            limit.name, limit.argument, f"argument '{limit.argument}' {exc} (limit '{limit.name}')"
        ) from None
    return Debit(key, "budget", limit.name, scope, amount, limit.cap_units, limit.window_s * 1000)


def debits_for(limits: Sequence[LimitSpec], request: GateRequest, *, tenant_tag: str) -> list[Debit]:
    """Every counter the call would move, in a fixed order (so every check sees limits alike)."""
    matching = [limit for limit in limits if tool_matches(limit.tool, request.tool)]
    return [debit_for(limit, request, tenant_tag=tenant_tag) for limit in matching]


def halt_matches(scope: str, request: GateRequest) -> bool:
    kind, _, value = scope.partition(":")
    if scope == "*":
        return True
    if kind == "tool":
        return tool_matches(value, request.tool)
    if kind == "tag":
        return any(same_name(value, tag) for tag in request.tags)
    if kind == "agent":
        return same_name(value, request.agent)
    return False


def valid_halt_scope(scope: str) -> bool:
    kind, sep, value = scope.partition(":")
    return scope == "*" or (bool(sep) and kind in {"tool", "tag", "agent"} and 0 < len(value) <= 190)


# ------------------------------------------------------------------------------ circuit breakers

BreakerPhase = Literal["closed", "open", "trial_due", "trial_running"]


@dataclass(frozen=True)
class BreakerSpec:
    """What the gate and the outcome counter need of a CircuitBreaker row (decoupled from the ORM).
    `rate_units`: the failure rate in 1/SCALE (0.5 → 5000), compared exactly."""

    id: int
    name: str
    tool: str
    state: str  # "closed", "open" or "half_open"
    generation: int
    consecutive_failures: int
    rate_units: int
    min_volume: int
    window_s: int
    cool_down_s: int
    opened_at_ms: int | None = None
    trial_at_ms: int | None = None
    trial: tuple[str, str] = ("", "")  # the trial's (saga_id, step_id)


@dataclass(frozen=True)
class Tally:
    """A breaker's counts once some outcomes were added: the most failures in a row seen (the run
    before the batch included), and the calls and failures over its window."""

    consecutive: int
    calls: int
    failures: int


def breaker_phase(spec: BreakerSpec, now_ms: int) -> BreakerPhase:
    """`open`: refused until the cool-down ends; `trial_due`: the next call may be the trial (the
    cool-down ended, or the running trial lapsed: its outcome never came within a cool-down);
    `trial_running`: a trial is out, every other call refused."""
    cool_ms = spec.cool_down_s * 1000
    if spec.state == "open":
        return "open" if now_ms < (spec.opened_at_ms or 0) + cool_ms else "trial_due"
    if spec.state == "half_open":
        return "trial_running" if now_ms < (spec.trial_at_ms or 0) + cool_ms else "trial_due"
    return "closed"


def breaker_retry_after(spec: BreakerSpec, now_ms: int) -> int:
    """Seconds until a call may be let through as a trial (at least 1)."""
    since = spec.opened_at_ms if spec.state == "open" else spec.trial_at_ms
    return max(1, math.ceil(((since or 0) + spec.cool_down_s * 1000 - now_ms) / 1000))


def trip_reason(spec: BreakerSpec, tally: Tally) -> str | None:
    """Why the breaker opens on these counts, or None."""
    if tally.consecutive >= spec.consecutive_failures:
        return f"{tally.consecutive} consecutive failures (threshold {spec.consecutive_failures})"
    if tally.calls >= spec.min_volume and tally.failures * SCALE >= spec.rate_units * tally.calls:
        return (
            f"{tally.failures} of {tally.calls} calls failed over {spec.window_s} s "
            f"(threshold {from_units(spec.rate_units)}, at least {spec.min_volume} calls)"
        )
    return None
