"""The saga engine: a transactional boundary around steps, write-ahead ordering of each step's
records, the gate asked before each effect, and LIFO rollback when the block raises.

What each record holds is `records.py`; the rollback rules `rollback.py`; steps, tools and their
errors `steps.py`; the current saga and the process defaults `context.py`. This module re-exports
their public names, so `sagaplane.saga` still offers what it always did.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from contextvars import Token
from typing import Any, Literal, TypeVar, cast

from . import credentials, records, reservations, retry, rollback, tracing
from .chain import token_hex
from .context import (
    active_saga,
    current_saga,
    get_default_confirm,
    get_default_gate,
    get_default_wal,
    next_step_id,
    run_coro,
    set_default_confirm,
    set_default_gate,
    set_default_wal,
    tool_call_id,
)
from .gate import Call as GateCall
from .gate import GateDenied
from .rollback import RollbackReport, SagaAborted
from .semantics import COMPENSABLE, IRREVERSIBLE, Compensation, Semantics
from .steps import (
    CompensateSpec,
    ConfirmHook,
    ConfirmRequest,
    EffectNotApplied,
    IrreversibleRefused,
    SagaError,
    Step,
    StepState,
    ToolSpec,
    refuse_irreversible,
    tool,
)
from .wal import WAL

__all__ = [
    "DEFAULT_LEASE_TTL",
    "CompensateSpec",
    "ConfirmHook",
    "ConfirmRequest",
    "EffectNotApplied",
    "IrreversibleRefused",
    "RollbackReport",
    "Saga",
    "SagaAborted",
    "SagaError",
    "Step",
    "StepState",
    "ToolSpec",
    "current_saga",
    "get_default_gate",
    "get_default_wal",
    "next_step_id",
    "refuse_irreversible",
    "saga",
    "set_default_confirm",
    "set_default_gate",
    "set_default_wal",
    "tool",
    "tool_call_id",
]

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_LEASE_TTL = 30.0


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
        self.credentials = credentials.Resolved()  # the values its steps resolved (to scrub them)

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
        records.saga_start(self.wal, self.saga_id, self.name, self.lease_ttl)
        self.wal.hold_lease(self.saga_id, self.lease_ttl)
        self._token = active_saga.set(self)
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
                active_saga.reset(self._token)
            except ValueError:  # exited in a different context (e.g. a generator); just clear
                active_saga.set(None)
            self._token = None

    def _finish_record(self) -> int:
        # Stop renewing first, so no SAGA_LEASE can follow the terminal record.
        self.wal.release_lease(self.saga_id)
        aborted = self._fully_rolled_back
        clean = self.last_report.clean if (aborted and self.last_report) else True
        # The terminal record is written through (a SIGKILL right after the saga returned must
        # not make it look abandoned); a durable saga's is also fsynced by the caller.
        mark = records.saga_end(self.wal, self.saga_id, aborted=aborted, clean=clean, buffered=self._durable)
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
        mark = records.saga_start(self.wal, self.saga_id, self.name, lease_ttl, suspended=True)
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
            if saga.steps[-1].needs_fsync:
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
            records.abort_cause(self.wal, self.saga_id, exc, self.scrub(str(exc)))
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
            records.abort_cause(self.wal, self.saga_id, exc, self.scrub(str(exc)))
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
        shown = credentials.recorded(bound)  # references, never values (sagaplane.credentials)
        return Step(
            index=len(self.steps) + 1,
            step_id=next_step_id.get() or token_hex(16),
            saga_id=self.saga_id,
            tool=spec.name,
            semantics=spec.semantics,
            kwargs=shown,
            gate_args=None if spec.gate_args is None else spec.gate_args(shown),
            call_id=tool_call_id.get(),
            secret_args=shown is not bound,
            reason=spec.reason_for(shown),
            reserve=spec.reserve_for(shown),
        )

    def scrub(self, text: str) -> str:
        """`text` without the values of the credentials this saga resolved (their references instead)."""
        return self.credentials.scrub(text) if self.credentials.values else text

    def _confirm_hook(self, spec: ToolSpec) -> ConfirmHook:
        return spec.confirm or self.confirm or get_default_confirm() or refuse_irreversible

    def _refused(self, step: Step, reason: str) -> IrreversibleRefused:
        # Logged so the evidence shows the attempt; the step never joins the stack.
        records.refused(self.wal, step, reason)
        return IrreversibleRefused(step.confirm_request(), reason)

    def _intent(self, step: Step) -> int:
        mark = records.intent(self.wal, step)
        self.steps.append(step)
        reservations.running_step.set(step)  # what sp.settle() settles, in this context
        return mark

    def _committed(self, spec: ToolSpec, step: Step, result: Any) -> int:
        step.state = StepState.COMMITTED
        spec.derive_compensation(step, result, failed=False)
        return records.committed(self.wal, step)

    def _failed(self, spec: ToolSpec, step: Step, exc: BaseException) -> int:
        step.error = self.scrub(repr(exc))
        if retry.not_applied(exc):
            step.state = StepState.NOT_APPLIED
        else:
            step.state = StepState.UNKNOWN
            spec.derive_compensation(step, None, failed=True)
        return records.failed(self.wal, step)

    def _gate_call(self, step: Step) -> GateCall:
        return GateCall(
            self.saga_id,
            step.step_id,
            step.tool,
            step.semantics.value,
            dict(step.kwargs) if step.gate_args is None else step.gate_args,
            self.wal.agent or "",
            reason=step.reason,
            reserve=step.reserve,
        )

    def _gate_answered(self, step: Step, answer: dict[str, Any] | None) -> None:
        step.decision = "allowed_locally" if answer is None else "allow"
        if answer is not None:
            reservation = answer.get("reservation")
            if isinstance(reservation, dict):
                step.reservation_id = str(reservation.get("id") or "")
            records.gate_allow(self.wal, step, answer)

    def _gate_denied(self, step: Step, denied: GateDenied) -> GateDenied:
        # Logged so the evidence shows the attempt and why it was stopped; the step never ran.
        step.decision = f"deny:{denied.reason}"
        records.gate_deny(self.wal, step, denied)
        return denied

    def _ask_gate(self, step: Step) -> dict[str, Any] | None:
        gate = get_default_gate()
        if gate is None:
            return None
        try:
            answer = gate.check(self._gate_call(step))
        except GateDenied as denied:
            raise self._gate_denied(step, denied) from None
        self._gate_answered(step, answer)
        return answer

    async def _ask_gate_async(self, step: Step) -> dict[str, Any] | None:
        gate = get_default_gate()
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
            answer = self._confirm_hook(spec)(step.confirm_request())
            if inspect.isawaitable(answer):
                answer = run_coro(answer)
            if answer is not True:
                raise self._refused(step, "confirmation hook refused" if answer is False else str(answer))
        if spec.capture_state is not None:
            cargs, ckwargs = retry.resolved_arguments(self, step, args, kwargs)
            step.captured = spec.capture_state(*cargs, **ckwargs)
        mark = self._intent(step)
        if step.needs_fsync:
            self._durable = True
            self.wal.sync(mark)  # the intent is on disk before the effect can happen
        if spec.retry is not None or spec.fallback is not None or step.secret_args:
            return retry.run(self, spec, step, args, kwargs)
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
            answer = self._confirm_hook(spec)(step.confirm_request())
            if inspect.isawaitable(answer):
                answer = await answer
            if answer is not True:
                raise self._refused(step, "confirmation hook refused" if answer is False else str(answer))
        if spec.capture_state is not None:
            cargs, ckwargs = retry.resolved_arguments(self, step, args, kwargs)
            captured = spec.capture_state(*cargs, **ckwargs)
            step.captured = await captured if inspect.isawaitable(captured) else captured
        mark = self._intent(step)
        if step.needs_fsync:
            self._durable = True
            # fsync off the event loop, on the WAL's flusher thread: concurrent sagas (tasks and
            # threads alike) share its fsync rounds.
            await self.wal.sync_async(mark)
        if spec.retry is not None or spec.fallback is not None or step.secret_args:
            return await retry.run_async(self, spec, step, args, kwargs)
        try:
            result = await spec.fn(*args, **kwargs)
        except BaseException as exc:
            await self._settle_async(step, self._failed(spec, step, exc))
            raise
        await self._settle_async(step, self._committed(spec, step, result))
        return result

    # -- rollback (the rules: rollback.py) ---------------------------------------------

    def _rolled_back(self, report: RollbackReport) -> RollbackReport:
        self.last_report = report
        if report.to_step == 0:
            self._fully_rolled_back = True
        return report

    def rollback(self, to_step: int = 0) -> RollbackReport:
        """Compensate every step after `to_step` (all of them by default), newest first."""
        report = self._rolled_back(rollback.run(rollback.rollback_steps(self, to_step)))
        if self._durable:
            self.wal.sync()
        return report

    async def rollback_async(self, to_step: int = 0) -> RollbackReport:
        report = self._rolled_back(await rollback.run_async(rollback.rollback_steps(self, to_step)))
        if self._durable:
            await self.wal.sync_async()
        return report


def saga(_fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """`with saga(name=...)`, `async with saga(...)`, `@saga`, or `@saga(name=...)`."""
    if _fn is not None and callable(_fn) and not isinstance(_fn, str):
        return Saga(**options)(_fn)
    if isinstance(_fn, str):
        options.setdefault("name", _fn)
    return Saga(**options)
