"""The fleet's commands as typed inputs (`core.inputs`): a budget, a rate limit and a halt. The
API views parse their bodies with these, the Fleet page's forms build the same bodies from what was
typed, the services take the dataclasses, and the OpenAPI schema documents the serializers (their
names are the schema's components)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from core.inputs import Amount, Choice, Input, Strings, Text, Whole
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
