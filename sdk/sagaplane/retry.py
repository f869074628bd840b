"""Retries and a fallback inside one step: `sp.tool(fn, retry=sp.Retry(...), fallback=other_tool)`.

Every attempt is the same step: one step id, so one idempotency key (a tool with `retry=` that
takes an `idempotency_key` parameter gets `idempotency_key(saga, step, "forward")`, the same on
every attempt), one gate answer and so one approval and one debit (the gate is asked once, before
the first attempt; a halt that reaches the agent meanwhile stops the retries, with a GATE_DENY),
one intent. Each failed attempt that is followed by another call is a `STEP_ATTEMPT` record (its
number, its error, whether its outcome is unknown or not applied, what comes next: `retry` after
`delay_s`, or `fallback`); the last attempt's outcome is the step's usual record (`STEP_COMMITTED`
/ `STEP_FAILED` / `STEP_UNKNOWN`) with `attempts`.

The fallback, another tool, is called once the retries are exhausted, and only when no attempt's
outcome is unknown (each raised `EffectNotApplied`): after an attempt that may have had its effect,
a second tool's effect could double it, so the step ends `STEP_UNKNOWN` as without a fallback. The
fallback is another tool: the gate is asked for it (its halts, limits and approvals hold) under the
step id `<step id>:fallback`, and its `STEP_ATTEMPT` (`next: fallback`, naming the call) is its
intent, fsynced first when the fallback is COMPENSABLE or IRREVERSIBLE. Done, the step is
`COMPLETED_VIA_FALLBACK` (agent-saga's record) with the fallback's semantics and compensation.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import credentials, records
from .context import get_default_gate
from .credentials import SecretUnresolved
from .gate import GateDenied
from .semantics import IRREVERSIBLE, idempotency_key
from .steps import EffectNotApplied, Step, ToolSpec, resolve_tool

if TYPE_CHECKING:
    from .saga import Saga

logger = logging.getLogger("sagaplane")

BACKOFFS = ("exponential", "linear")
ErrorKinds = tuple[type[BaseException] | str, ...]


@dataclass(frozen=True)
class Retry:
    """How a step's call is retried. `max_attempts` counts the first call. The pause after failed
    attempt n is `base_s * 2**(n-1)` (exponential) or `base_s * n` (linear), at most `cap_s`, and
    with `jitter` a uniformly random part of that (full jitter). An exception is retried when it is
    one of `retry_on` and none of `no_retry_on`: classes, or names matching a class of its MRO by
    `__name__` or `module.qualname` ("TimeoutError", "httpx.ConnectError")."""

    max_attempts: int = 3
    backoff: str = "exponential"
    base_s: float = 0.1
    cap_s: float = 10.0
    jitter: bool = True
    retry_on: ErrorKinds = (Exception,)
    no_retry_on: ErrorKinds = ()
    sleep: Callable[[float], Any] | None = field(default=None, compare=False, repr=False)  # tests
    rng: random.Random | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError("Retry.max_attempts: an integer of at least 1")
        if self.backoff not in BACKOFFS:
            raise ValueError(f"Retry.backoff: one of {', '.join(BACKOFFS)}, not {self.backoff!r}")
        if not (0 <= self.base_s <= 86_400 and 0 <= self.cap_s <= 86_400):
            raise ValueError("Retry.base_s and Retry.cap_s: seconds between 0 and 86400")
        object.__setattr__(self, "retry_on", tuple(self.retry_on))
        object.__setattr__(self, "no_retry_on", tuple(self.no_retry_on))

    def delay(self, attempt: int) -> float:
        """The pause after failed attempt `attempt` (1-based)."""
        if self.backoff == "exponential":
            try:
                raw = self.base_s * 2.0 ** (attempt - 1) if self.base_s else 0.0
            except OverflowError:
                raw = self.cap_s
        else:
            raw = self.base_s * attempt
        raw = min(raw, self.cap_s)
        return (self.rng or random).uniform(0.0, raw) if self.jitter else raw

    def retries(self, exc: BaseException) -> bool:
        return _matches(exc, self.retry_on) and not _matches(exc, self.no_retry_on)


def _matches(exc: BaseException, kinds: ErrorKinds) -> bool:
    for kind in kinds:
        if isinstance(kind, type):
            if isinstance(exc, kind):
                return True
        elif any(kind in (c.__name__, f"{c.__module__}.{c.__qualname__}") for c in type(exc).__mro__):
            return True
    return False


def not_applied(exc: BaseException) -> bool:
    """The call said nothing happened (or a credential could not be resolved, so it was not made)."""
    return isinstance(exc, EffectNotApplied | SecretUnresolved)


def forward_key(step: Step) -> str:
    return idempotency_key(step.saga_id, step.step_id, "forward")


def resolved_arguments(
    saga: Saga, step: Step, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments with their references resolved now. Raises SecretUnresolved."""
    if step.secret_args:
        return saga.credentials.resolve(args), saga.credentials.resolve(kwargs)
    return args, kwargs


def call_arguments(
    saga: Saga, spec: ToolSpec, step: Step, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments the tool is called with now: references resolved, the step's forward key
    given to a retried tool that takes one. Raises SecretUnresolved."""
    args, kwargs = resolved_arguments(saga, step, args, kwargs)
    if spec.retry is not None and spec.takes_idempotency_key and "idempotency_key" not in kwargs:
        kwargs = {**kwargs, "idempotency_key": forward_key(step)}
    return args, kwargs


def _halted(saga: Saga, step: Step) -> bool:
    """A halt reached the agent since the step's gate answer: its retries stop (GATE_DENY). Read
    from the gate's last fleet state, without a round-trip or a second debit."""
    halt_for = getattr(get_default_gate(), "halt_for", None)
    halt = halt_for(saga._gate_call(step)) if halt_for is not None else None
    if halt is None:
        return False
    saga._gate_denied(
        step, GateDenied("halted", {"scope": halt.get("scope"), "halt_reason": halt.get("reason")})
    )
    return True


def _failed_attempt(saga: Saga, step: Step, number: int, exc: BaseException, **extra: Any) -> int:
    return records.attempt(
        saga.wal, step, number, not_applied(exc), saga.scrub(repr(exc)), forward_key(step), **extra
    )


@dataclass
class _Fallback:
    spec: ToolSpec
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    step: Step  # the fallback as a step of its own to the gate: `<step id>:fallback`


def _sub_id(step_id: str) -> str:
    sub = f"{step_id}:fallback"
    return sub if len(sub) <= 128 else hashlib.sha256(sub.encode()).hexdigest()[:32]


def _plan(
    saga: Saga, spec: ToolSpec, step: Step, args: tuple[Any, ...], kwargs: dict[str, Any], unknown: bool
) -> _Fallback | None:
    if spec.fallback is None:
        return None
    if unknown:
        logger.warning("step %r: an attempt's outcome is unknown; its fallback is not called", step.tool)
        return None
    target = spec.fallback if isinstance(spec.fallback, ToolSpec) else resolve_tool(spec.fallback)
    if target is None:
        logger.error("step %r: no tool %r to fall back to", step.tool, spec.fallback)
        return None
    if spec.fallback_args is not None:
        args, kwargs = (), spec.fallback_args(dict(kwargs))
    bound = target.bind(args, kwargs)
    shown = credentials.recorded(bound)
    sub = Step(
        index=step.index,
        step_id=_sub_id(step.step_id),
        saga_id=step.saga_id,
        tool=target.name,
        semantics=target.semantics,
        kwargs=shown,
        gate_args=None if target.gate_args is None else target.gate_args(shown),
        call_id=step.call_id,
        secret_args=shown is not bound,
    )
    return _Fallback(target, args, kwargs, sub)


def _start_fallback(saga: Saga, step: Step, fb: _Fallback, attempt: int, exc: BaseException) -> int:
    """Its intent (the last primary attempt's record, naming the call); the step becomes the
    fallback's. Returns the record's sync mark."""
    call = {"tool": fb.spec.name, "semantics": fb.spec.semantics.value, "kwargs": fb.step.kwargs}
    mark = _failed_attempt(saga, step, attempt, exc, next_="fallback", fallback=call, buffered=False)
    step.fallback = fb.spec.name
    step.semantics = fb.spec.semantics
    step.kwargs = fb.step.kwargs
    step.captured = None
    step.secret_args = fb.step.secret_args
    return mark


def run(saga: Saga, spec: ToolSpec, step: Step, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The step's attempts, then its fallback; records each and settles the step's outcome."""
    policy, unknown, attempt = spec.retry, False, 0
    while True:
        attempt += 1
        step.attempts = attempt
        try:
            call_args, call_kwargs = call_arguments(saga, spec, step, args, kwargs)
            result = spec.fn(*call_args, **call_kwargs)
        except Exception as exc:
            unknown = unknown or not not_applied(exc)
            if (
                policy is not None
                and attempt < policy.max_attempts
                and policy.retries(exc)
                and not _halted(saga, step)
            ):
                delay = policy.delay(attempt)
                _failed_attempt(saga, step, attempt, exc, next_="retry", delay_s=delay)
                (policy.sleep or time.sleep)(delay)
                continue
            fb = _plan(saga, spec, step, args, kwargs, unknown)
            if fb is None:
                saga._settle(step, saga._failed(spec, step, exc))
                raise
            return _fallback(saga, spec, step, fb, attempt, exc)
        except BaseException as exc:
            saga._settle(step, saga._failed(spec, step, exc))
            raise
        saga._settle(step, saga._committed(spec, step, result))
        return result


def _fallback(saga: Saga, spec: ToolSpec, step: Step, fb: _Fallback, attempt: int, exc: BaseException) -> Any:
    try:
        answer = saga._ask_gate(fb.step)
        if fb.spec.semantics is IRREVERSIBLE and not saga._approved_by_people(answer):
            confirmed = saga._confirm_hook(fb.spec)(fb.step.confirm_request())
            if inspect.isawaitable(confirmed):
                from .context import run_coro

                confirmed = run_coro(confirmed)
            if confirmed is not True:
                raise saga._refused(fb.step, "confirmation hook refused")
    except Exception:
        saga._settle(step, saga._failed(spec, step, exc))
        raise exc from None
    mark = _start_fallback(saga, step, fb, attempt, exc)
    if step.needs_fsync:
        saga._durable = True
        saga.wal.sync(mark)
    try:
        call_args, call_kwargs = call_arguments(saga, fb.spec, step, fb.args, fb.kwargs)
        result = fb.spec.fn(*call_args, **call_kwargs)
        if inspect.isawaitable(result):  # an async tool as the fallback of a sync one
            from .context import run_coro

            result = run_coro(result)
    except BaseException as fexc:
        saga._settle(step, saga._failed(fb.spec, step, fexc))
        raise
    saga._settle(step, saga._committed(fb.spec, step, result))
    return result


async def _pause(policy: Retry, delay: float) -> None:
    if policy.sleep is None:
        await asyncio.sleep(delay)
        return
    out = policy.sleep(delay)
    if inspect.isawaitable(out):
        await out


async def run_async(
    saga: Saga, spec: ToolSpec, step: Step, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """`run` for an async tool (and an async fallback)."""
    policy, unknown, attempt = spec.retry, False, 0
    while True:
        attempt += 1
        step.attempts = attempt
        try:
            call_args, call_kwargs = call_arguments(saga, spec, step, args, kwargs)
            result = await spec.fn(*call_args, **call_kwargs)
        except Exception as exc:
            unknown = unknown or not not_applied(exc)
            if (
                policy is not None
                and attempt < policy.max_attempts
                and policy.retries(exc)
                and not _halted(saga, step)
            ):
                delay = policy.delay(attempt)
                _failed_attempt(saga, step, attempt, exc, next_="retry", delay_s=delay)
                await _pause(policy, delay)
                continue
            fb = _plan(saga, spec, step, args, kwargs, unknown)
            if fb is None:
                await saga._settle_async(step, saga._failed(spec, step, exc))
                raise
            return await _fallback_async(saga, spec, step, fb, attempt, exc)
        except BaseException as exc:
            await saga._settle_async(step, saga._failed(spec, step, exc))
            raise
        await saga._settle_async(step, saga._committed(spec, step, result))
        return result


async def _fallback_async(
    saga: Saga, spec: ToolSpec, step: Step, fb: _Fallback, attempt: int, exc: BaseException
) -> Any:
    try:
        answer = await saga._ask_gate_async(fb.step)
        if fb.spec.semantics is IRREVERSIBLE and not saga._approved_by_people(answer):
            confirmed = saga._confirm_hook(fb.spec)(fb.step.confirm_request())
            if inspect.isawaitable(confirmed):
                confirmed = await confirmed
            if confirmed is not True:
                raise saga._refused(fb.step, "confirmation hook refused")
    except Exception:
        await saga._settle_async(step, saga._failed(spec, step, exc))
        raise exc from None
    mark = _start_fallback(saga, step, fb, attempt, exc)
    if step.needs_fsync:
        saga._durable = True
        await saga.wal.sync_async(mark)
    try:
        call_args, call_kwargs = call_arguments(saga, fb.spec, step, fb.args, fb.kwargs)
        out = fb.spec.fn(*call_args, **call_kwargs)
        result = await out if inspect.isawaitable(out) else out
    except BaseException as fexc:
        await saga._settle_async(step, saga._failed(fb.spec, step, fexc))
        raise
    await saga._settle_async(step, saga._committed(fb.spec, step, result))
    return result


__all__ = ["Retry", "forward_key", "not_applied", "run", "run_async"]
