"""The saga engine: steps with paired compensations, write-ahead ordering, LIFO rollback.

The rollback rules live in one generator (`_rollback_steps`) driven by a sync and
an async driver, so the two flavours cannot drift apart on the invariants that
matter: LIFO order, one outcome per step, bounded retries, halting, honesty.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import logging
import os
from collections.abc import Awaitable, Callable, Generator
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

from . import tracing
from .chain import token_hex
from .gate import Call as GateCall
from .gate import Gate, GateDenied
from .semantics import (
    COMPENSABLE,
    IRREVERSIBLE,
    PREVIEW,
    REVERSIBLE,
    Compensation,
    Semantics,
    accepts_kwarg,
    idempotency_key,
)
from .wal import ENV_AGENT, WAL

logger = logging.getLogger("sagaplane")

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_LEASE_TTL = 30.0


class StepState(str, enum.Enum):  # noqa: UP042 (str() must stay the value on 3.10)
    INTENT = "INTENT"  # intent logged, effect not (yet) known to have run
    COMMITTED = "COMMITTED"
    UNKNOWN = "UNKNOWN"  # forward call raised: the effect may or may not have landed
    NOT_APPLIED = "NOT_APPLIED"  # the tool said, via EffectNotApplied, that nothing happened
    COMPENSATED = "COMPENSATED"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"
    ORPHANED = "ORPHANED"  # ran (or may have) and has no inverse
    UNRESOLVED = "UNRESOLVED"  # rollback halted before reaching it


class SagaError(Exception):
    pass


class EffectNotApplied(Exception):
    """Raise from a tool to say the effect certainly did not happen (validation, a decline).

    Any other exception leaves the step UNKNOWN: a timed-out charge may have landed,
    so it is still compensated (idempotently) or reported as orphaned.
    """


class IrreversibleRefused(SagaError):
    """An IRREVERSIBLE step was not confirmed. Raised before its intent or effect."""

    def __init__(self, request: ConfirmRequest, reason: str = "not confirmed") -> None:
        self.request = request
        self.reason = reason
        super().__init__(f"irreversible step {request.tool!r} refused: {reason}")


@dataclass(frozen=True)
class ConfirmRequest:
    saga_id: str
    step_id: str
    tool: str
    semantics: Semantics
    kwargs: dict[str, Any]


ConfirmHook = Callable[[ConfirmRequest], bool | Awaitable[bool]]


def refuse_irreversible(request: ConfirmRequest) -> bool:
    """The default confirmation hook: an irreversible effect needs someone to say yes."""
    return False


@dataclass(eq=False)
class Step:
    index: int  # 1-based position in the saga; what rollback(to_step=N) refers to
    step_id: str
    saga_id: str
    tool: str
    semantics: Semantics
    kwargs: dict[str, Any]
    state: StepState = StepState.INTENT
    compensation: Compensation | None = None
    captured: Any = None
    error: str | None = None
    attempts: int = 0
    gate_args: dict[str, Any] | None = None  # what the gate reads, when not the kwargs themselves
    call_id: str = ""  # the framework's id of this tool call (a model's tool call id), if any
    decision: str = ""  # the gate's answer, for the step's span: "allow", "deny:<reason>", ""

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.saga_id, self.step_id, "compensate")

    def __repr__(self) -> str:
        return f"Step(#{self.index} {self.tool} {self.semantics.value} {self.state.value})"


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

    def outcome_of(self, step: Step) -> str | None:
        for label in ("compensated", "failed", "orphaned", "unresolved", "skipped"):
            if step in getattr(self, label):
                return label
        return None

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


_current: ContextVar[Saga | None] = ContextVar("sagaplane_current_saga", default=None)
# Set by an integration around one governed call: the framework's id of the tool call (a model's
# tool call id), carried by the step's span as gen_ai.tool.call.id.
tool_call_id: ContextVar[str] = ContextVar("sagaplane_tool_call_id", default="")
# Set by an integration whose framework re-runs a paused call (LangGraph's interrupt/resume): the
# next step's id, derived from the tool call, so the re-run is the same step to the gate (and finds
# the approval request the first run opened). Empty: a random id.
next_step_id: ContextVar[str] = ContextVar("sagaplane_next_step_id", default="")


def current_saga() -> Saga | None:
    return _current.get()


# The process default WAL, confirmation hook and gate, set by sagaplane.configure().
_defaults: dict[str, Any] = {"wal": None, "confirm": None, "gate": None}


def set_default_gate(gate: Gate | None) -> None:
    _defaults["gate"] = gate


def get_default_gate() -> Gate | None:
    return _defaults["gate"]


def set_default_wal(wal: WAL | None) -> None:
    _defaults["wal"] = wal


def get_default_wal() -> WAL:
    wal = _defaults["wal"]
    if wal is None:
        path = os.environ.get("SAGAPLANE_WAL", "sagaplane.wal")
        wal = WAL(path, agent=os.environ.get(ENV_AGENT) or None)
        _defaults["wal"] = wal
    return wal


def set_default_confirm(confirm: ConfirmHook | None) -> None:
    _defaults["confirm"] = confirm


class Saga:
    """One transactional boundary. Use as `with`, `async with`, or a decorator.

    A Saga object runs once; as a decorator it creates a fresh one per call.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        wal: WAL | None = None,
        saga_id: str | None = None,
        confirm: ConfirmHook | None = None,
        halt_on_failure: bool = True,
        max_attempts: int = 3,
        retry_delay: float = 0.05,
        lease_ttl: float = DEFAULT_LEASE_TTL,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.name = name
        self._wal = wal
        self.saga_id = saga_id or (f"{name}-{token_hex(6)}" if name else token_hex(16))
        self._fixed_id = saga_id is not None
        self.confirm = confirm
        self.halt_on_failure = halt_on_failure
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self.lease_ttl = lease_ttl
        self.steps: list[Step] = []
        self.status = "new"  # new -> running -> complete | aborted
        self.last_report: RollbackReport | None = None
        self._fully_rolled_back = False
        # Any step made us fsync: the terminal record must then be durable too, so a saga that
        # returned "complete" can never look unfinished (and be rolled back) after a power loss.
        self._durable = False
        self._token: Token[Saga | None] | None = None
        self._span: Any = None  # the saga's OpenTelemetry span, when the agent traces

    @property
    def wal(self) -> WAL:
        if self._wal is None:
            self._wal = get_default_wal()
        return self._wal

    def _clone(self) -> Saga:
        return Saga(
            self.name,
            wal=self._wal,
            confirm=self.confirm,
            halt_on_failure=self.halt_on_failure,
            max_attempts=self.max_attempts,
            retry_delay=self.retry_delay,
            lease_ttl=self.lease_ttl,
        )

    # -- boundary ----------------------------------------------------------------------

    def _begin(self) -> None:
        if self.status != "new":
            raise SagaError("a Saga runs once; create a new one (or use it as a decorator)")
        self.status = "running"
        fields: dict[str, Any] = {"saga_id": self.saga_id, "pid": os.getpid(), "lease_ttl": self.lease_ttl}
        if self.name:
            fields["name"] = self.name
        if self.wal.agent:
            fields["agent"] = self.wal.agent
        self.wal.emit("SAGA_START", fields, buffered=True)  # reaches the file with the first intent
        self.wal.hold_lease(self.saga_id, self.lease_ttl)
        self._token = _current.set(self)
        # With OpenTelemetry in the agent, the saga is a span carrying its id (sagaplane/tracing.py).
        self._span = tracing.saga_span(self.name or "saga", self.saga_id)
        if self._span is not None:
            try:
                self._span.__enter__()
            except Exception:
                self._span = None

    def _leave(self) -> None:
        self.wal.release_lease(self.saga_id)
        span, self._span = self._span, None
        if span is not None:
            try:
                span.__exit__(None, None, None)
            except Exception:  # ended in another context: tracing never fails a saga
                pass
        if self._token is not None:
            try:
                _current.reset(self._token)
            except ValueError:  # exited in a different context (e.g. a generator); just clear
                _current.set(None)
            self._token = None

    def _finish_record(self) -> int:
        # Stop renewing first, so no SAGA_LEASE can follow the terminal record.
        self.wal.release_lease(self.saga_id)
        aborted = self._fully_rolled_back
        clean = self.last_report.clean if (aborted and self.last_report) else True
        # The terminal record is written through (a SIGKILL right after the saga returned must
        # not make it look abandoned); a durable saga's is also fsynced by the caller.
        mark = self.wal.emit(
            "SAGA_ABORTED" if aborted else "SAGA_COMPLETE",
            {"saga_id": self.saga_id, "clean": clean},
            buffered=self._durable,
        )
        self.status = "aborted" if aborted else "complete"
        return mark

    def _finish(self) -> None:
        mark = self._finish_record()
        if self._durable:
            self.wal.sync(mark)

    async def _finish_async(self) -> None:
        mark = self._finish_record()
        if self._durable:
            await self.wal.sync_async(mark)

    def _abort_cause(self, exc: BaseException) -> None:
        message = str(exc)
        self.wal.emit(
            "SAGA_ABORT_CAUSE",
            {"saga_id": self.saga_id, "cause_type": type(exc).__name__, "cause": message[:2000]},
            buffered=True,
        )

    # -- pausing for a person (LangGraph's interrupt, a run resumed later or elsewhere) --------

    def suspend(self, lease_ttl: float) -> list[dict[str, Any]]:
        """Pause a running saga without a terminal record, for a framework that pauses for people:
        this process stops renewing its lease and a SAGA_START names the time a decision may take
        (`lease_ttl`, after which recovery takes the saga over as it does a dead agent's). Returns
        the journal (`journal()`) that `Saga.resume` continues it from, here or in another
        process."""
        if self.status != "running":
            raise SagaError(f"saga {self.saga_id} is {self.status}; only a running saga is suspended")
        self.wal.release_lease(self.saga_id)
        fields: dict[str, Any] = {"saga_id": self.saga_id, "pid": os.getpid(), "lease_ttl": lease_ttl}
        fields["suspended"] = True
        if self.name:
            fields["name"] = self.name
        if self.wal.agent:
            fields["agent"] = self.wal.agent
        mark = self.wal.emit("SAGA_START", fields)
        if self._durable:
            self.wal.sync(mark)
        self._leave()
        self.status = "suspended"
        return self.journal()

    def journal(self) -> list[dict[str, Any]]:
        """The steps as JSON: what a rollback of this saga needs in another process."""
        return [
            {
                "step_id": s.step_id,
                "tool": s.tool,
                "semantics": s.semantics.value,
                "state": s.state.value,
                "compensation": None
                if s.compensation is None or not s.compensation.handler
                else {"handler": s.compensation.handler, "kwargs": s.compensation.kwargs},
            }
            for s in self.steps
        ]

    @classmethod
    def resume(cls, saga_id: str, journal: list[dict[str, Any]], **options: Any) -> Saga:
        """A Saga continuing a suspended one (`suspend`): same id, its steps restored (compensated
        through their registered handlers on rollback). Enter it as any saga."""
        saga = cls(saga_id=saga_id, **options)
        for entry in journal:
            comp = entry.get("compensation")
            saga.steps.append(
                Step(
                    index=len(saga.steps) + 1,
                    step_id=str(entry["step_id"]),
                    saga_id=saga_id,
                    tool=str(entry["tool"]),
                    semantics=Semantics(entry["semantics"]),
                    kwargs={},
                    state=StepState(entry["state"]),
                    compensation=None
                    if not comp
                    else Compensation(handler=str(comp["handler"]), kwargs=dict(comp.get("kwargs") or {})),
                )
            )
            if saga.steps[-1].semantics in (COMPENSABLE, IRREVERSIBLE):
                saga._durable = True
        return saga

    def __enter__(self) -> Saga:
        self._begin()
        return self

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is None and self.status == "suspended":
            return False  # paused (`suspend`): whoever resumes it writes its end
        try:
            if exc is None:
                self._finish()
                return False
            self._abort_cause(exc)
            report = self.rollback()
            self._finish()
        finally:
            self._leave()
        if isinstance(exc, Exception):
            raise SagaAborted(exc, report) from exc
        return False  # KeyboardInterrupt / SystemExit propagate as themselves, after rollback

    async def __aenter__(self) -> Saga:
        self._begin()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> Literal[False]:
        if exc is None and self.status == "suspended":
            return False
        try:
            if exc is None:
                await self._finish_async()
                return False
            self._abort_cause(exc)
            report = await self.rollback_async()
            await self._finish_async()
        finally:
            self._leave()
        if isinstance(exc, Exception):
            raise SagaAborted(exc, report) from exc
        return False

    def __call__(self, fn: F) -> F:
        """Decorator form: each call runs inside a fresh saga with this configuration."""
        if self.name is None:
            self.name = fn.__name__
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                async with self._clone():
                    return await fn(*args, **kwargs)

            return cast(F, awrapper)  # called as fn is: it passes every argument through

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._clone():
                return fn(*args, **kwargs)

        return cast(F, wrapper)

    # -- steps -------------------------------------------------------------------------

    def _new_step(self, spec: ToolSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Step:
        if self.status != "running":
            raise SagaError(f"saga {self.saga_id} is {self.status}; no new steps")
        bound = spec.bind(args, kwargs)
        return Step(
            index=len(self.steps) + 1,
            step_id=next_step_id.get() or token_hex(16),
            saga_id=self.saga_id,
            tool=spec.name,
            semantics=spec.semantics,
            kwargs=bound,
            gate_args=None if spec.gate_args is None else spec.gate_args(bound),
            call_id=tool_call_id.get(),
        )

    def _confirm_request(self, step: Step) -> ConfirmRequest:
        return ConfirmRequest(self.saga_id, step.step_id, step.tool, step.semantics, dict(step.kwargs))

    def _confirm_hook(self, spec: ToolSpec) -> ConfirmHook:
        return spec.confirm or self.confirm or _defaults["confirm"] or refuse_irreversible

    def _refused(self, step: Step, reason: str) -> IrreversibleRefused:
        # Logged so the evidence shows the attempt; the step never joins the stack.
        self.wal.emit(
            "STEP_REFUSED",
            {
                "saga_id": self.saga_id,
                "step_id": step.step_id,
                "tool": step.tool,
                "semantics": step.semantics.value,
                "kwargs": step.kwargs,
                "reason": reason,
            },
            buffered=True,
        )
        return IrreversibleRefused(self._confirm_request(step), reason)

    def _intent(self, step: Step) -> int:
        fields: dict[str, Any] = {
            "saga_id": self.saga_id,
            "step_id": step.step_id,
            "tool": step.tool,
            "semantics": step.semantics.value,
            "kwargs": step.kwargs,
        }
        if step.captured is not None:
            fields["captured_state"] = step.captured
        # COMPENSABLE/IRREVERSIBLE: written through now and fsynced by the caller before the
        # effect. REVERSIBLE: queued like agent-saga's fast path (in the file within the WAL's
        # flush_interval, or now with write_through_intents). PREVIEW has no effect at all.
        sem = step.semantics
        buffered = sem is PREVIEW or (sem is REVERSIBLE and not self.wal.write_through_intents)
        mark = self.wal.emit("STEP_INTENT", fields, buffered=buffered)
        self.steps.append(step)
        return mark

    @staticmethod
    def _needs_fsync(step: Step) -> bool:
        return step.semantics in (COMPENSABLE, IRREVERSIBLE)

    def _derive(self, spec: ToolSpec, step: Step, result: Any, *, failed: bool) -> None:
        comp = spec.compensate
        if comp is None:
            return
        try:
            if isinstance(comp, Compensation):
                derived: Any = comp
            else:
                extra: dict[str, Any] = {}
                if accepts_kwarg(comp, "state"):
                    extra["state"] = step.captured
                if accepts_kwarg(comp, "kwargs"):
                    extra["kwargs"] = dict(step.kwargs)
                derived = comp(result, **extra)
        except Exception as exc:
            # A factory that cannot cope with a failed call (result None) is normal; one
            # that breaks on a real result is a bug worth shouting about.
            (logger.debug if failed else logger.error)(
                "compensation factory for %r raised: %r", step.tool, exc
            )
            return
        if derived is None or isinstance(derived, Compensation):
            step.compensation = derived
        elif callable(derived):
            step.compensation = Compensation(fn=derived)
        else:
            logger.error(
                "compensation factory for %r returned %r; treating as no inverse", step.tool, derived
            )
        if step.compensation is not None and self._needs_fsync(step) and not step.compensation.recoverable:
            logger.warning(
                "step %r has an in-process-only compensation (no registered handler or non-JSON kwargs); "
                "it is unrecoverable if this process dies",
                step.tool,
            )

    def _descriptor(self, step: Step) -> dict[str, Any] | None:
        return step.compensation.describe(step.idempotency_key) if step.compensation else None

    def _committed(self, spec: ToolSpec, step: Step, result: Any) -> int:
        step.state = StepState.COMMITTED
        self._derive(spec, step, result, failed=False)
        mark = self.wal.emit(
            "STEP_COMMITTED",
            {
                "saga_id": self.saga_id,
                "step_id": step.step_id,
                "tool": step.tool,
                "semantics": step.semantics.value,
                "compensation": self._descriptor(step),
            },
            buffered=True,
        )
        return mark

    def _failed(self, spec: ToolSpec, step: Step, exc: BaseException) -> int:
        step.error = repr(exc)
        if isinstance(exc, EffectNotApplied):
            step.state = StepState.NOT_APPLIED
            mark = self.wal.emit(
                "STEP_FAILED",
                {
                    "saga_id": self.saga_id,
                    "step_id": step.step_id,
                    "tool": step.tool,
                    "semantics": step.semantics.value,
                    "error": step.error,
                },
                buffered=True,
            )
            return mark
        step.state = StepState.UNKNOWN
        self._derive(spec, step, None, failed=True)
        mark = self.wal.emit(
            "STEP_UNKNOWN",
            {
                "saga_id": self.saga_id,
                "step_id": step.step_id,
                "tool": step.tool,
                "semantics": step.semantics.value,
                "error": step.error,
                "compensation": self._descriptor(step),
            },
            buffered=True,
        )
        return mark

    def _gate_call(self, step: Step) -> GateCall:
        return GateCall(
            self.saga_id,
            step.step_id,
            step.tool,
            step.semantics.value,
            dict(step.kwargs) if step.gate_args is None else step.gate_args,
            self.wal.agent or "",
        )

    def _gate_answered(self, step: Step, answer: dict[str, Any] | None) -> None:
        step.decision = "allowed_locally" if answer is None else "allow"
        if answer is not None:
            fields: dict[str, Any] = {
                "saga_id": self.saga_id,
                "step_id": step.step_id,
                "tool": step.tool,
                "authorization_id": answer.get("authorization_id"),
            }
            if answer.get("approvals"):
                fields["approvals"] = answer["approvals"]  # the approvals this authorisation used
            self.wal.emit("GATE_ALLOW", fields, buffered=True)

    def _gate_denied(self, step: Step, denied: GateDenied) -> GateDenied:
        # Logged so the evidence shows the attempt and why it was stopped; the step never ran.
        step.decision = f"deny:{denied.reason}"
        self.wal.emit(
            "GATE_DENY",
            {
                "saga_id": self.saga_id,
                "step_id": step.step_id,
                "tool": step.tool,
                "semantics": step.semantics.value,
                "kwargs": step.kwargs,
                "reason": denied.reason,
                "answer": denied.answer,
            },
            buffered=True,
        )
        return denied

    def _ask_gate(self, step: Step) -> dict[str, Any] | None:
        gate = _defaults["gate"]
        if gate is None:
            return None
        try:
            answer = gate.check(self._gate_call(step))
        except GateDenied as denied:
            raise self._gate_denied(step, denied) from None
        self._gate_answered(step, answer)
        return answer

    async def _ask_gate_async(self, step: Step) -> dict[str, Any] | None:
        gate = _defaults["gate"]
        if gate is None:
            return None
        try:
            answer = await asyncio.to_thread(gate.check, self._gate_call(step))
        except GateDenied as denied:
            raise self._gate_denied(step, denied) from None
        self._gate_answered(step, answer)
        return answer

    @staticmethod
    def _approved_by_people(answer: dict[str, Any] | None) -> bool:
        """The control plane authorised this effect with a human approval bound to its exact
        arguments (consumed by this authorisation): that replaces the local `confirm=` hook."""
        return bool(answer and answer.get("decision") == "allow" and answer.get("approvals"))

    def _tool_span(self, step: Step) -> tracing.ToolSpan | None:
        return tracing.tool_span(
            step.tool,
            step.call_id or step.step_id,
            self.saga_id,
            step.step_id,
            step.semantics.value,
            self._span,
        )

    def run_step(self, spec: ToolSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        step = self._new_step(spec, args, kwargs)
        span = self._tool_span(step)
        if span is None:
            return self._run_step(spec, step, args, kwargs)
        try:
            result = self._run_step(spec, step, args, kwargs)
        except BaseException as exc:
            span.end(step.decision, step.state.value, exc)
            raise
        span.end(step.decision, step.state.value)
        return result

    def _run_step(self, spec: ToolSpec, step: Step, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        gate_answer = self._ask_gate(step)
        if step.semantics is IRREVERSIBLE and not self._approved_by_people(gate_answer):
            answer = self._confirm_hook(spec)(self._confirm_request(step))
            if inspect.isawaitable(answer):
                answer = _run_coro(answer)
            if answer is not True:
                raise self._refused(step, "confirmation hook refused" if answer is False else str(answer))
        if spec.capture_state is not None:
            step.captured = spec.capture_state(*args, **kwargs)
        mark = self._intent(step)
        durable = self._needs_fsync(step)
        if durable:
            self._durable = True
            self.wal.sync(mark)  # the intent is on disk before the effect can happen
        try:
            result = spec.fn(*args, **kwargs)
        except BaseException as exc:
            self._settle(step, self._failed(spec, step, exc))
            raise
        self._settle(step, self._committed(spec, step, result))
        return result

    def _settle(self, step: Step, mark: int) -> None:
        """Durability of a step's outcome record (STEP_COMMITTED / FAILED / UNKNOWN).

        COMPENSABLE: no fsync on the critical path. The outcome is buffered, rides the next
        intent's barrier (or the terminal record's), and is fsynced within the WAL's
        durable_delay otherwise. Losing it in a crash leaves "intent, no outcome": the step is
        UNKNOWN, which recovery already handles (compensated idempotently or reported). The
        intent -- the record that must precede the effect -- was durable before it ran.
        IRREVERSIBLE: fsynced now. Nothing undoes the effect, so whether it happened is kept."""
        if step.semantics is IRREVERSIBLE:
            self.wal.sync(mark)
        elif step.semantics is COMPENSABLE:
            self.wal.sync_soon(mark)

    async def _settle_async(self, step: Step, mark: int) -> None:
        if step.semantics is IRREVERSIBLE:
            await self.wal.sync_async(mark)
        elif step.semantics is COMPENSABLE:
            self.wal.sync_soon(mark)

    async def run_step_async(self, spec: ToolSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        step = self._new_step(spec, args, kwargs)
        span = self._tool_span(step)
        if span is None:
            return await self._run_step_async(spec, step, args, kwargs)
        try:
            result = await self._run_step_async(spec, step, args, kwargs)
        except BaseException as exc:
            span.end(step.decision, step.state.value, exc)
            raise
        span.end(step.decision, step.state.value)
        return result

    async def _run_step_async(
        self, spec: ToolSpec, step: Step, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        gate_answer = await self._ask_gate_async(step)
        if step.semantics is IRREVERSIBLE and not self._approved_by_people(gate_answer):
            answer = self._confirm_hook(spec)(self._confirm_request(step))
            if inspect.isawaitable(answer):
                answer = await answer
            if answer is not True:
                raise self._refused(step, "confirmation hook refused" if answer is False else str(answer))
        if spec.capture_state is not None:
            captured = spec.capture_state(*args, **kwargs)
            step.captured = await captured if inspect.isawaitable(captured) else captured
        mark = self._intent(step)
        durable = self._needs_fsync(step)
        if durable:
            self._durable = True
            # fsync off the event loop, on the WAL's flusher thread: concurrent sagas (tasks and
            # threads alike) share its fsync rounds.
            await self.wal.sync_async(mark)
        try:
            result = await spec.fn(*args, **kwargs)
        except BaseException as exc:
            await self._settle_async(step, self._failed(spec, step, exc))
            raise
        await self._settle_async(step, self._committed(spec, step, result))
        return result

    # -- rollback ----------------------------------------------------------------------

    def _rollback_steps(self, to_step: int) -> Generator[Any, BaseException | None, RollbackReport]:
        """The rollback rules. Yields (step, fn, kwargs) to run or _Sleep; receives the error or None."""
        if to_step < 0:
            raise ValueError("to_step must be >= 0")
        report = RollbackReport(to_step=to_step)
        # An already-compensated step is not touched again: compensating twice is a no-op.
        targets = [
            s for s in reversed(self.steps) if s.index > to_step and s.state is not StepState.COMPENSATED
        ]
        start: dict[str, Any] = {"saga_id": self.saga_id, "steps": len(targets)}
        if to_step:
            start["to_step"] = to_step
        self.wal.emit("ROLLBACK_START", start, buffered=True)
        for step in targets:
            if report.halted:
                step.state = StepState.UNRESOLVED
                report.unresolved.append(step)
                continue
            if step.semantics is PREVIEW or step.state in (StepState.NOT_APPLIED, StepState.INTENT):
                report.skipped.append(step)
                continue
            if step.compensation is None:
                step.state = StepState.ORPHANED
                report.orphaned.append(step)
                self.wal.emit(
                    "STEP_ORPHANED",
                    {
                        "saga_id": self.saga_id,
                        "step_id": step.step_id,
                        "tool": step.tool,
                        "semantics": step.semantics.value,
                    },
                    buffered=True,
                )
                logger.error("ORPHANED: %r (%s) ran and has no inverse", step.tool, step.semantics.value)
                continue
            try:
                fn = step.compensation.callable()
            except LookupError as exc:
                fn, lookup_error = None, exc
            kwargs = dict(step.compensation.kwargs)
            if fn is not None and accepts_kwarg(fn, "idempotency_key"):
                kwargs.setdefault("idempotency_key", step.idempotency_key)
            report.order.append(step)
            error: BaseException | None = None
            attempts = 0
            if fn is None:  # a handler name nobody registered: retrying cannot help
                attempts, error = 1, lookup_error
            while fn is not None and attempts < self.max_attempts:
                attempts += 1
                error = yield (step, fn, kwargs)
                if error is None:
                    break
                if attempts < self.max_attempts and self.retry_delay > 0:
                    yield _Sleep(self.retry_delay * (2 ** (attempts - 1)))
            step.attempts += attempts
            if error is None:
                step.state = StepState.COMPENSATED
                report.compensated.append(step)
                self.wal.emit(
                    "COMPENSATED",
                    {
                        "saga_id": self.saga_id,
                        "step_id": step.step_id,
                        "tool": step.tool,
                        "idempotency_key": step.idempotency_key,
                        "attempts": attempts,
                    },
                    buffered=True,
                )
                continue
            step.state = StepState.COMPENSATION_FAILED
            step.error = repr(error)
            report.failed.append(step)
            self.wal.emit(
                "COMPENSATION_FAILED",
                {
                    "saga_id": self.saga_id,
                    "step_id": step.step_id,
                    "tool": step.tool,
                    "error": repr(error),
                    "attempts": attempts,
                    "idempotency_key": step.idempotency_key,
                },
                buffered=True,
            )
            logger.error("compensation FAILED for %r after %d attempt(s): %r", step.tool, attempts, error)
            if self.halt_on_failure:
                report.halted = True
        end: dict[str, Any] = {
            "saga_id": self.saga_id,
            "clean": report.clean,
            "compensated": len(report.compensated),
            "failed": len(report.failed),
            "orphaned": len(report.orphaned),
            "unresolved": len(report.unresolved),
            "halted": report.halted,
        }
        if to_step:
            end["to_step"] = to_step
        self.wal.emit("ROLLBACK_END", end, buffered=True)
        self.last_report = report
        if to_step == 0:
            self._fully_rolled_back = True
        (logger.info if report.clean else logger.error)("saga %s: %s", self.saga_id, report.summary())
        return report

    def rollback(self, to_step: int = 0) -> RollbackReport:
        """Compensate every step after `to_step` (all of them by default), newest first."""
        gen = self._rollback_steps(to_step)
        sent: BaseException | None = None
        try:
            while True:
                item = gen.send(sent)
                sent = None
                if isinstance(item, _Sleep):
                    import time

                    time.sleep(item.seconds)
                    continue
                _step, fn, kwargs = item
                try:
                    out = fn(**kwargs)
                    if inspect.isawaitable(out):
                        _run_coro(out)
                except Exception as exc:
                    sent = exc
        except StopIteration as stop:
            report: RollbackReport = stop.value
        if self._durable:
            self.wal.sync()
        return report

    async def rollback_async(self, to_step: int = 0) -> RollbackReport:
        gen = self._rollback_steps(to_step)
        sent: BaseException | None = None
        try:
            while True:
                item = gen.send(sent)
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
        if self._durable:
            await self.wal.sync_async()
        return report


def _run_coro(awaitable: Awaitable[Any]) -> Any:
    """Run an awaitable from sync code (a sync saga calling an async hook or compensator)."""

    async def wrap() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wrap())
    # A loop is running in this thread: run the coroutine on a private loop in a helper thread.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wrap()).result()


CompensateSpec = Compensation | Callable[..., Any] | None


@dataclass
class ToolSpec:
    fn: Callable[..., Any]
    name: str
    semantics: Semantics
    compensate: CompensateSpec = None
    capture_state: Callable[..., Any] | None = None
    confirm: ConfirmHook | None = None
    # The gate's arguments from the call's (bound) kwargs, when they are not the kwargs themselves
    # (a policy's gate_args); raising refuses the call before anything is recorded.
    gate_args: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        # The signature is read once per tool, not once per call.
        self._sig: inspect.Signature | None = None
        self._positional: tuple[str, ...] | None = None  # set when the fast bind applies
        self._names: frozenset[str] = frozenset()
        try:
            self._sig = inspect.signature(self.fn)
        except (TypeError, ValueError):
            return
        params = self._sig.parameters.values()
        kinds = {p.kind for p in params}
        if kinds <= {inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY}:
            self._positional = tuple(
                p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            )
            self._names = frozenset(p.name for p in params)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name, for the STEP_INTENT record."""
        positional = self._positional
        if (
            positional is not None
            and len(args) <= len(positional)
            and (
                not kwargs
                or (self._names.issuperset(kwargs) and kwargs.keys().isdisjoint(positional[: len(args)]))
            )
        ):
            # What Signature.bind_partial gives for a signature without */**/positional-only.
            out = dict(zip(positional, args, strict=False))
            if kwargs:
                out.update(kwargs)
            return out
        try:
            if self._sig is None:
                raise TypeError("no signature")
            return dict(self._sig.bind_partial(*args, **kwargs).arguments)
        except (TypeError, ValueError):
            out = {f"arg{i}": a for i, a in enumerate(args)}
            out.update(kwargs)
            return out


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    semantics: Semantics | str,
    compensate: CompensateSpec = None,
    name: str | None = None,
    capture_state: Callable[..., Any] | None = None,
    confirm: ConfirmHook | None = None,
) -> Any:
    """Wrap a tool so each call inside a saga becomes a logged, compensable step.

    `compensate` is a factory over the forward result: `lambda result: sp.undo("x.refund", id=result["id"])`
    (it may also accept `state=` for the captured snapshot and `kwargs=` for the call's arguments),
    a fixed `Compensation`, or None for "no inverse". Outside a saga the tool runs untouched.
    """
    sem = Semantics(semantics)

    def decorate(target: Callable[..., Any]) -> Callable[..., Any]:
        spec = ToolSpec(
            target, name or str(getattr(target, "__name__", "tool")), sem, compensate, capture_state, confirm
        )
        if inspect.iscoroutinefunction(target):

            @functools.wraps(target)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                active = _current.get()
                if active is None:
                    return await target(*args, **kwargs)
                return await active.run_step_async(spec, args, kwargs)

            awrapper.__sagaplane_tool__ = spec  # type: ignore[attr-defined]
            return awrapper

        @functools.wraps(target)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            active = _current.get()
            if active is None:
                return target(*args, **kwargs)
            return active.run_step(spec, args, kwargs)

        wrapper.__sagaplane_tool__ = spec  # type: ignore[attr-defined]
        return wrapper

    return decorate(fn) if fn is not None else decorate


def saga(_fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """`with saga(name=...)`, `async with saga(...)`, `@saga`, or `@saga(name=...)`."""
    if _fn is not None and callable(_fn) and not isinstance(_fn, str):
        return Saga(**options)(_fn)
    if isinstance(_fn, str):
        options.setdefault("name", _fn)
    return Saga(**options)
