"""Rollback: compensate completed steps newest first, with bounded retries, halting at the first
failure, and report honestly what is left standing.

The rules live in one generator (`rollback_steps`) driven by a sync and an async driver, so the
two flavours cannot drift apart on the invariants that matter: LIFO order, one outcome per step,
bounded retries, halting, honesty.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import records
from .context import run_coro
from .credentials import SecretUnresolved
from .semantics import PREVIEW, accepts_kwarg
from .steps import SagaError, Step, StepState

if TYPE_CHECKING:
    from .saga import Saga

logger = logging.getLogger("sagaplane")


@dataclass
class RollbackReport:
    """What a rollback achieved. `clean` is false whenever anything is left standing."""

    to_step: int = 0
    compensated: list[Step] = field(default_factory=list)
    failed: list[Step] = field(default_factory=list)
    orphaned: list[Step] = field(default_factory=list)
    unresolved: list[Step] = field(default_factory=list)
    skipped: list[Step] = field(default_factory=list)  # nothing to undo (PREVIEW, not applied)
    halted: bool = False
    order: list[Step] = field(default_factory=list)  # every compensation attempted, in order

    @property
    def clean(self) -> bool:
        return not (self.failed or self.orphaned or self.unresolved)

    @property
    def partial(self) -> bool:
        return not self.clean

    def summary(self) -> str:
        if self.clean:
            return f"rollback clean: {len(self.compensated)} step(s) compensated"
        parts = [f"{len(self.compensated)} compensated"]
        for label, steps in (
            ("FAILED", self.failed),
            ("ORPHANED", self.orphaned),
            ("UNRESOLVED", self.unresolved),
        ):
            if steps:
                parts.append(f"{len(steps)} {label}: {', '.join(s.tool for s in steps)}")
        return "rollback PARTIAL: " + "; ".join(parts) + (" (halted)" if self.halted else "")


class SagaAborted(SagaError):
    """The saga body raised; rollback ran. Carries the cause and the report."""

    def __init__(self, cause: BaseException, report: RollbackReport) -> None:
        self.cause = cause
        self.report = report
        super().__init__(f"{type(cause).__name__}: {cause} | {report.summary()}")


@dataclass(frozen=True)
class _Sleep:
    seconds: float


# What the rules yield: a compensation to run (the step, its callable, its kwargs) or a pause;
# what they are sent back: the compensation's exception, or None when it returned.
Yielded = tuple[Step, Callable[..., Any], dict[str, Any]] | _Sleep
Rules = Generator[Yielded, BaseException | None, RollbackReport]


def rollback_steps(saga: Saga, to_step: int) -> Rules:
    """The rollback rules. Yields (step, fn, kwargs) to run or _Sleep; receives the error or None."""
    if to_step < 0:
        raise ValueError("to_step must be >= 0")
    report = RollbackReport(to_step=to_step)
    # An already-compensated step is not touched again: compensating twice is a no-op.
    targets = [s for s in reversed(saga.steps) if s.index > to_step and s.state is not StepState.COMPENSATED]
    records.rollback_start(saga.wal, saga.saga_id, len(targets), to_step)
    for step in targets:
        if report.halted:
            step.state = StepState.UNRESOLVED
            report.unresolved.append(step)
        elif step.semantics is PREVIEW or step.state in (StepState.NOT_APPLIED, StepState.INTENT):
            report.skipped.append(step)
        elif step.compensation is None:
            step.state = StepState.ORPHANED
            report.orphaned.append(step)
            records.orphaned(saga.wal, step)
            logger.error("ORPHANED: %r (%s) ran and has no inverse", step.tool, step.semantics.value)
        else:
            yield from _compensate(saga, step, report)
    records.rollback_end(saga.wal, saga.saga_id, report)
    (logger.info if report.clean else logger.error)("saga %s: %s", saga.saga_id, report.summary())
    return report


def _compensate(
    saga: Saga, step: Step, report: RollbackReport
) -> Generator[Yielded, BaseException | None, None]:
    """One step's compensation, retried up to the saga's max_attempts with exponential pauses."""
    assert step.compensation is not None
    try:
        fn: Callable[..., Any] | None = step.compensation.callable()
    except LookupError as exc:
        fn, lookup_error = None, exc
    try:  # its credential references, resolved now (sagaplane.credentials)
        kwargs = dict(saga.credentials.resolve(step.compensation.kwargs, markers=True))
    except SecretUnresolved as exc:
        fn, lookup_error, kwargs = None, exc, {}
    if fn is not None and accepts_kwarg(fn, "idempotency_key"):
        kwargs.setdefault("idempotency_key", step.idempotency_key)
    report.order.append(step)
    error: BaseException | None = None
    attempts = 0
    if fn is None:  # a handler name nobody registered: retrying cannot help
        attempts, error = 1, lookup_error
    while fn is not None and attempts < saga.max_attempts:
        attempts += 1
        error = yield (step, fn, kwargs)
        if error is None:
            break
        if attempts < saga.max_attempts and saga.retry_delay > 0:
            yield _Sleep(saga.retry_delay * (2 ** (attempts - 1)))
    step.attempts += attempts
    if error is None:
        step.state = StepState.COMPENSATED
        report.compensated.append(step)
        records.compensated(saga.wal, step, attempts)
        return
    step.state = StepState.COMPENSATION_FAILED
    step.error = saga.scrub(repr(error))
    report.failed.append(step)
    records.compensation_failed(saga.wal, step, step.error, attempts)
    logger.error("compensation FAILED for %r after %d attempt(s): %r", step.tool, attempts, error)
    if saga.halt_on_failure:
        report.halted = True


def run(rules: Rules) -> RollbackReport:
    """Drive the rules from sync code: compensations called in this thread."""
    sent: BaseException | None = None
    try:
        while True:
            item = rules.send(sent)
            sent = None
            if isinstance(item, _Sleep):
                time.sleep(item.seconds)
                continue
            _step, fn, kwargs = item
            try:
                out = fn(**kwargs)
                if inspect.isawaitable(out):
                    run_coro(out)
            except Exception as exc:
                sent = exc
    except StopIteration as stop:
        report: RollbackReport = stop.value
    return report


async def run_async(rules: Rules) -> RollbackReport:
    """Drive the rules from a coroutine: async compensations awaited, sync ones in a thread."""
    sent: BaseException | None = None
    try:
        while True:
            item = rules.send(sent)
            sent = None
            if isinstance(item, _Sleep):
                await asyncio.sleep(item.seconds)
                continue
            _step, fn, kwargs = item
            try:
                if inspect.iscoroutinefunction(fn):
                    await fn(**kwargs)
                else:
                    out = await asyncio.to_thread(functools.partial(fn, **kwargs))
                    if inspect.isawaitable(out):
                        await out
            except Exception as exc:
                sent = exc
    except StopIteration as stop:
        report: RollbackReport = stop.value
    return report
