"""The fleet's commands as typed inputs (`core.inputs`): a budget, a rate limit, a halt, a breaker,
the gate's settings, a quarantine, a reservation's settlement and a lease's return. The
API views parse their bodies with these, the Fleet page's forms build the same bodies from what was
typed, the services take the dataclasses, and the OpenAPI schema documents the serializers (their
names are the schema's components)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from rest_framework import serializers
from rest_framework.fields import SkipField, empty

from core.errors import DomainError
from core.inputs import Amount, Choice, Flag, Input, Strings, Text, Whole
from fleet import gate
from fleet.models import HaltMode, OnCap

NAME_MAX = 100
MAX_WINDOW_S = 366 * 24 * 3600
MAX_TTL_S = 366 * 24 * 3600
REASON_MAX = 500


def _per_ok(per: list[str]) -> bool:
    return gate.valid_per(per) and len(set(per)) == len(per)


def _cap(value: Any) -> Decimal:
    """A budget's cap as stored: rounded up to the gate's units."""
    units = gate.to_units(value if not isinstance(value, str) else Decimal(value))
    return Decimal(units) / gate.SCALE


def _name() -> Text:
    return Text(
        code="invalid_name",
        message=f"name must be 1 to {NAME_MAX} characters",
        max_length=NAME_MAX,
        stripped=True,
    )


def _tool() -> Text:
    return Text(
        code="invalid_tool",
        message="tool must be a glob of 1 to 200 characters",
        max_length=200,
        required=False,
    )


def _window() -> Whole:
    message = f"window_s must be a whole number from 1 to {MAX_WINDOW_S}"
    return Whole(code="invalid_window", message=message, min_value=1, max_value=MAX_WINDOW_S)


def _per() -> Strings:
    message = 'per must be a list of distinct "agent", "api_key", "tool" or "arg:<name>"'
    return Strings(
        code="invalid_per", message=message, valid=_per_ok, max_length=4, required=False, allow_null=True
    )


def _reason() -> Text:
    message = f"a reason of 1 to {REASON_MAX} characters is required"
    return Text(code="invalid_reason", message=message, max_length=REASON_MAX, stripped=True)


# ---------------------------------------------------------------------------------------- budgets


@dataclass(frozen=True)
class NewBudget:
    """At most `max_total` of the call's `argument` over any `window_s`, per scope (`per`)."""

    name: str
    max_total: Decimal
    window_s: int
    tool: str = "*"
    argument: str = "amount"
    per: tuple[str, ...] = ()
    on_cap: str = OnCap.DENY


class BudgetCreate(Input[NewBudget]):
    """A new budget: at most `max_total` (a number or a decimal string) of the call's `argument`
    over any `window_s` seconds, per scope (`per`), on the tools matching `tool`."""

    command = NewBudget

    name = _name()
    tool = _tool()
    window_s = _window()
    per = _per()
    argument = Text(
        code="invalid_argument_name",
        message="argument must name the numeric argument",
        max_length=100,
        required=False,
    )
    max_total = Amount(code="invalid_max_total", message="max_total must be a positive number", convert=_cap)
    on_cap = Choice(
        OnCap.values,
        code="invalid_on_cap",
        message=f"on_cap must be one of {', '.join(OnCap.values)}",
        required=False,
    )


# ------------------------------------------------------------------------------------ rate limits


@dataclass(frozen=True)
class NewRateLimit:
    """At most `max_calls` over `window_s` (GCRA), per scope (`per`)."""

    name: str
    max_calls: int
    window_s: int
    tool: str = "*"
    per: tuple[str, ...] = ()


class RateLimitCreate(Input[NewRateLimit]):
    """A new rate limit: at most `max_calls` over `window_s` seconds, per scope (`per`), on the
    tools matching `tool`."""

    command = NewRateLimit

    name = _name()
    tool = _tool()
    window_s = _window()
    per = _per()
    max_calls = Whole(
        code="invalid_max_calls",
        message="max_calls must be a whole number from 1 to 10^9",
        min_value=1,
        max_value=10**9,
    )


# ------------------------------------------------------------------------------------------ halts


@dataclass(frozen=True)
class NewHalt:
    """A kill switch on `scope` ("*", "tool:<glob>", "tag:<t>", "agent:<name>"), for `ttl_s`
    seconds or until resumed."""

    scope: str
    reason: str
    mode: str = HaltMode.HALT
    ttl_s: int | None = None


class HaltCreate(Input[NewHalt]):
    """A kill switch: `halt` refuses every matching call, `drain` new sagas only; `ttl_s` lifts
    it by itself."""

    command = NewHalt
    MISSING_IS_WRONG = True  # a halt without a scope or reason is refused as a wrong one

    scope = Text(
        code="invalid_scope",
        message='scope must be "*", "tool:<glob>", "tag:<t>" or "agent:<name>"',
        max_length=200,
        valid=gate.valid_halt_scope,
    )
    mode = Choice(
        HaltMode.values,
        code="invalid_mode",
        message=f"mode must be one of {', '.join(HaltMode.values)}",
        required=False,
    )
    reason = _reason()
    ttl_s = Whole(
        code="invalid_ttl",
        message=f"ttl_s must be a whole number from 1 to {MAX_TTL_S}",
        min_value=1,
        max_value=MAX_TTL_S,
        required=False,
        allow_null=True,
    )


# ------------------------------------------------------------------------------- circuit breakers

MAX_CONSECUTIVE = 10**6
MAX_VOLUME = 10**9
RATE_MESSAGE = "failure_rate must be a number above 0 and at most 1, with at most 4 decimals"


def _failure_rate(value: Any) -> Decimal:
    """A failure rate as stored, exactly: at most 1 and at most 4 decimals (ValueError otherwise;
    a string only in plain ASCII decimal notation)."""
    if isinstance(value, str) and not re.fullmatch(r"[0-9]{1,8}(\.[0-9]{1,8})?", value):
        raise ValueError(value)
    rate = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    exponent = rate.as_tuple().exponent
    if not rate.is_finite() or rate > 1 or (isinstance(exponent, int) and exponent < -4):
        raise ValueError(value)
    return rate


@dataclass(frozen=True)
class NewBreaker:
    """Opens after `consecutive_failures` in a row, or `failure_rate` of at least `min_volume` calls
    over `window_s`; lets one trial call through after `cool_down_s`."""

    name: str
    tool: str
    consecutive_failures: int
    failure_rate: Decimal
    min_volume: int
    window_s: int
    cool_down_s: int


@dataclass(frozen=True)
class BreakerChange:
    """The settings a change names (None: unchanged)."""

    name: str | None = None
    tool: str | None = None
    consecutive_failures: int | None = None
    failure_rate: Decimal | None = None
    min_volume: int | None = None
    window_s: int | None = None
    cool_down_s: int | None = None


def _breaker_name(required: bool) -> Text:
    message = f"name must be 1 to {NAME_MAX} characters"
    return Text(code="invalid_name", message=message, max_length=NAME_MAX, stripped=True, required=required)


def _breaker_tool(required: bool) -> Text:
    message = "tool must be a glob of 1 to 200 characters"
    return Text(code="invalid_tool", message=message, max_length=200, required=required)


def _whole(name: str, code: str, high: int, required: bool) -> Whole:
    message = f"{name} must be a whole number from 1 to {high}"
    return Whole(code=code, message=message, min_value=1, max_value=high, required=required)


def _rate(required: bool) -> Amount:
    return Amount(code="invalid_failure_rate", message=RATE_MESSAGE, convert=_failure_rate, required=required)


class BreakerCreate(Input[NewBreaker]):
    """A new circuit breaker on the tools matching `tool` (every setting required)."""

    command = NewBreaker

    name = _breaker_name(True)
    tool = _breaker_tool(True)
    consecutive_failures = _whole(
        "consecutive_failures", "invalid_consecutive_failures", MAX_CONSECUTIVE, True
    )
    failure_rate = _rate(True)
    min_volume = _whole("min_volume", "invalid_min_volume", MAX_VOLUME, True)
    window_s = _whole("window_s", "invalid_window", MAX_WINDOW_S, True)
    cool_down_s = _whole("cool_down_s", "invalid_cool_down", MAX_WINDOW_S, True)


class BreakerUpdate(Input[BreakerChange]):
    """A change of some of a breaker's settings (a change of the tool or a threshold starts its
    counts afresh)."""

    command = BreakerChange

    name = _breaker_name(False)
    tool = _breaker_tool(False)
    consecutive_failures = _whole(
        "consecutive_failures", "invalid_consecutive_failures", MAX_CONSECUTIVE, False
    )
    failure_rate = _rate(False)
    min_volume = _whole("min_volume", "invalid_min_volume", MAX_VOLUME, False)
    window_s = _whole("window_s", "invalid_window", MAX_WINDOW_S, False)
    cool_down_s = _whole("cool_down_s", "invalid_cool_down", MAX_WINDOW_S, False)


LEASE_TTL_MIN_MS = 100
LEASE_TTL_MAX_MS = 60_000


@dataclass(frozen=True)
class FleetSettingsChange:
    """The tenant's gate settings: `lease_ttl_ms`, how long a budget lease lives unless renewed
    (None: the deployment's default, 1 s)."""

    lease_ttl_ms: int | None


class FleetSettingsUpdate(Input[FleetSettingsChange]):
    """A change of the tenant's gate settings (every field named; null: the default)."""

    command = FleetSettingsChange

    lease_ttl_ms = Whole(
        code="invalid_lease_ttl",
        message=f"lease_ttl_ms must be a whole number of milliseconds from {LEASE_TTL_MIN_MS} to "
        f"{LEASE_TTL_MAX_MS}, or null for the default",
        min_value=LEASE_TTL_MIN_MS,
        max_value=LEASE_TTL_MAX_MS,
        allow_null=True,
    )


# ------------------------------------------------------------------------------------ quarantine


@dataclass(frozen=True)
class QuarantineTerms:
    """Why a saga is set aside; `preemptive` asks to set aside one no record has named yet."""

    reason: str
    preemptive: bool = False


class QuarantineCreate(Input[QuarantineTerms]):
    """`{"reason", "preemptive"?}`: a saga no record has named yet is 404 `saga_not_found` unless
    `preemptive` is true."""

    command = QuarantineTerms
    MISSING_IS_WRONG = True  # a missing reason is refused as a wrong one

    preemptive = Flag(code="invalid_preemptive", message="preemptive must be true or false", required=False)
    reason = _reason()


class _Asked(serializers.BooleanField):
    """Whether a quarantine's body asks to be preemptive: any `preemptive` but a missing or false
    one (a wrong one is then refused as such by `QuarantineCreate`, not as an unknown saga)."""

    def run_validation(self, data: Any = empty) -> Any:
        if data is empty:
            raise SkipField
        return data is not False


@dataclass(frozen=True)
class QuarantineAsk:
    """What a quarantine's body asks before its saga is looked up."""

    preemptive: bool = False


class QuarantineAsked(Input[QuarantineAsk]):
    """The part of a quarantine's body read before the saga is looked up (its 404 comes before
    the body is judged, unless the body asks for preemptive): not a schema, `QuarantineCreate` is."""

    command = QuarantineAsk

    preemptive = _Asked(required=False)


# ------------------------------------------------------------------- settlements and lease returns


class _Actual(serializers.CharField):
    """A reservation's actual cost: a JSON number or a decimal string, finite and not negative
    (`gate.to_units`), kept rounded up to the gate's units; refused with what is wrong with it."""

    def run_validation(self, data: Any = empty) -> Any:
        if data is empty:
            raise DomainError("invalid", "actual: the amount the call really cost", field="actual")
        try:
            units = gate.to_units(gate.amount_sent(data))
        except ValueError as exc:
            raise DomainError("invalid", f"actual: {exc}", field="actual") from None
        return Decimal(units) / gate.SCALE


@dataclass(frozen=True)
class Settlement:
    """What a reserved call really cost."""

    actual: Decimal


class GateSettle(Input[Settlement]):
    """`{"actual": amount}`: judged before the reservation is looked up."""

    command = Settlement

    actual = _Actual()


class _Used(serializers.DictField):
    """A lease's use, `{limit: amount}`: an object here; its limits and amounts are judged with
    the lease, once it is found (a lease given back already answers without judging them)."""

    def run_validation(self, data: Any = empty) -> Any:
        if data is empty:
            raise SkipField
        if not isinstance(data, dict):
            raise DomainError("invalid", "body.used: an object of amounts by limit", field="body.used")
        return dict(data)


@dataclass(frozen=True)
class LeaseUse:
    """What a lease's holder used of each limit (a limit not named: nothing)."""

    used: Mapping[str, Any] = field(default_factory=dict)


class GateLeaseReturn(Input[LeaseUse]):
    """`{"used"?: {limit: amount}}`: the object's shape here, its amounts with the lease."""

    command = LeaseUse

    used = _Used(required=False)
