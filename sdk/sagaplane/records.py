"""The records a saga writes to its WAL, one function per event: which fields each carries and
whether it is buffered (rides the next write-through) or written through at once. The saga
engine (`saga.py`, `rollback.py`) decides when; this module decides what."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .events import Event
from .semantics import PREVIEW, REVERSIBLE
from .steps import StepState

if TYPE_CHECKING:
    from .gate import GateDenied
    from .rollback import RollbackReport
    from .steps import Step
    from .wal import WAL


def saga_start(wal: WAL, saga_id: str, name: str | None, lease_ttl: float, *, suspended: bool = False) -> int:
    """SAGA_START, buffered: it reaches the file with the first intent. Written again, through,
    when the saga is suspended (`suspended: true`, the lease the pause may take)."""
    fields: dict[str, Any] = {"saga_id": saga_id, "pid": os.getpid(), "lease_ttl": lease_ttl}
    if suspended:
        fields["suspended"] = True
    if name:
        fields["name"] = name
    if wal.agent:
        fields["agent"] = wal.agent
    return wal.emit(Event.SAGA_START, fields, buffered=not suspended)


def saga_end(wal: WAL, saga_id: str, *, aborted: bool, clean: bool, buffered: bool) -> int:
    return wal.emit(
        Event.SAGA_ABORTED if aborted else Event.SAGA_COMPLETE,
        {"saga_id": saga_id, "clean": clean},
        buffered=buffered,
    )


def abort_cause(wal: WAL, saga_id: str, exc: BaseException, message: str) -> None:
    """SAGA_ABORT_CAUSE: `message` is the exception's text as it may be recorded (scrubbed of the
    saga's resolved credentials)."""
    wal.emit(
        Event.SAGA_ABORT_CAUSE,
        {"saga_id": saga_id, "cause_type": type(exc).__name__, "cause": message[:2000]},
        buffered=True,
    )


def _step_fields(step: Step) -> dict[str, Any]:
    return {
        "saga_id": step.saga_id,
        "step_id": step.step_id,
        "tool": step.tool,
        "semantics": step.semantics.value,
    }


def _outcome_fields(step: Step) -> dict[str, Any]:
    """A step's fields on its outcome record: with how many attempts it took and, when a fallback
    completed it (or failed to), that tool (sagaplane.retry)."""
    fields = _step_fields(step)
    if step.attempts > 1 or step.fallback:
        fields["attempts"] = step.attempts
    if step.fallback:
        fields["fallback"] = step.fallback
    if step.reservation_id and step.actual is not None:
        # sp.settle(): the control plane settles the reservation when this record is shipped.
        fields["settle"] = {"reservation_id": step.reservation_id, "actual": step.actual}
    return fields


def attempt(
    wal: WAL,
    step: Step,
    number: int,
    not_applied: bool,
    error: str,
    key: str,
    *,
    next_: str,
    delay_s: float = 0.0,
    fallback: dict[str, Any] | None = None,
    buffered: bool = True,
) -> int:
    """STEP_ATTEMPT: a failed attempt of a step that another call follows (`next`: "retry" after
    `delay_s`, or "fallback", then naming that call: the fallback's intent, written through)."""
    fields = {
        **_step_fields(step),
        "attempt": number,
        "outcome": "not_applied" if not_applied else "unknown",
        "error": error[:2000],
        "idempotency_key": key,
        "next": next_,
    }
    if next_ == "retry":
        fields["delay_s"] = round(delay_s, 3)
    if fallback is not None:
        fields["fallback"] = fallback
    return wal.emit(Event.STEP_ATTEMPT, fields, buffered=buffered)


def refused(wal: WAL, step: Step, reason: str) -> None:
    wal.emit(
        Event.STEP_REFUSED, {**_step_fields(step), "kwargs": step.kwargs, "reason": reason}, buffered=True
    )


def intent(wal: WAL, step: Step) -> int:
    fields = {**_step_fields(step), "kwargs": step.kwargs}
    if step.captured is not None:
        fields["captured_state"] = step.captured
    # COMPENSABLE/IRREVERSIBLE: written through now and fsynced by the caller before the
    # effect. REVERSIBLE: queued like agent-saga's fast path (in the file within the WAL's
    # flush_interval, or now with write_through_intents). PREVIEW has no effect at all.
    sem = step.semantics
    buffered = sem is PREVIEW or (sem is REVERSIBLE and not wal.write_through_intents)
    return wal.emit(Event.STEP_INTENT, fields, buffered=buffered)


def _descriptor(step: Step) -> dict[str, Any] | None:
    return step.compensation.describe(step.idempotency_key) if step.compensation else None


def committed(wal: WAL, step: Step) -> int:
    event = Event.COMPLETED_VIA_FALLBACK if step.fallback else Event.STEP_COMMITTED
    return wal.emit(event, {**_outcome_fields(step), "compensation": _descriptor(step)}, buffered=True)


def failed(wal: WAL, step: Step) -> int:
    """STEP_FAILED (the tool said nothing happened) or STEP_UNKNOWN (it may have)."""
    fields = {**_outcome_fields(step), "error": step.error}
    if step.state is StepState.NOT_APPLIED:
        return wal.emit(Event.STEP_FAILED, fields, buffered=True)
    fields["compensation"] = _descriptor(step)
    return wal.emit(Event.STEP_UNKNOWN, fields, buffered=True)


def gate_allow(wal: WAL, step: Step, answer: dict[str, Any]) -> None:
    fields: dict[str, Any] = {
        "saga_id": step.saga_id,
        "step_id": step.step_id,
        "tool": step.tool,
        "authorization_id": answer.get("authorization_id"),
    }
    if answer.get("approvals"):
        fields["approvals"] = answer["approvals"]  # the approvals this authorisation used
    if answer.get("reservation"):
        fields["reservation"] = answer["reservation"]  # the estimate reserved (sagaplane.reservations)
    if answer.get("lease"):
        # Decided in process on a budget lease: what it took of each limit (sagaplane.leases).
        fields["lease"], fields["debits"] = answer["lease"], answer.get("debits", {})
    wal.emit(Event.GATE_ALLOW, fields, buffered=True)


def gate_deny(wal: WAL, step: Step, denied: GateDenied) -> None:
    fields = {**_step_fields(step), "kwargs": step.kwargs, "reason": denied.reason, "answer": denied.answer}
    wal.emit(Event.GATE_DENY, fields, buffered=True)


def rollback_start(wal: WAL, saga_id: str, steps: int, to_step: int) -> None:
    start: dict[str, Any] = {"saga_id": saga_id, "steps": steps}
    if to_step:
        start["to_step"] = to_step
    wal.emit(Event.ROLLBACK_START, start, buffered=True)


def orphaned(wal: WAL, step: Step) -> None:
    wal.emit(Event.STEP_ORPHANED, _step_fields(step), buffered=True)


def compensated(wal: WAL, step: Step, attempts: int) -> None:
    fields = {
        "saga_id": step.saga_id,
        "step_id": step.step_id,
        "tool": step.tool,
        "idempotency_key": step.idempotency_key,
        "attempts": attempts,
    }
    wal.emit(Event.COMPENSATED, fields, buffered=True)


def compensation_failed(wal: WAL, step: Step, error: str | None, attempts: int) -> None:
    fields = {
        "saga_id": step.saga_id,
        "step_id": step.step_id,
        "tool": step.tool,
        "error": error,
        "attempts": attempts,
        "idempotency_key": step.idempotency_key,
    }
    wal.emit(Event.COMPENSATION_FAILED, fields, buffered=True)


def rollback_end(wal: WAL, saga_id: str, report: RollbackReport) -> None:
    end: dict[str, Any] = {
        "saga_id": saga_id,
        "clean": report.clean,
        "compensated": len(report.compensated),
        "failed": len(report.failed),
        "orphaned": len(report.orphaned),
        "unresolved": len(report.unresolved),
        "halted": report.halted,
    }
    if report.to_step:
        end["to_step"] = report.to_step
    wal.emit(Event.ROLLBACK_END, end, buffered=True)
