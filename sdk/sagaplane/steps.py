"""Steps and the tools that make them: a step's state and record of what ran, the errors a step
raises, the confirmation an irreversible step needs, and `tool()`, which turns a function into
steps of whichever saga is running when it is called."""

from __future__ import annotations

import enum
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import reservations
from .context import active_saga
from .credentials import Resolved
from .semantics import COMPENSABLE, IRREVERSIBLE, Compensation, Semantics, accepts_kwarg, idempotency_key

if TYPE_CHECKING:
    from .retry import Retry

logger = logging.getLogger("sagaplane")
REASON_MAX = 500  # what the server keeps of a call's reason (the rest is cut here)


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
    secret_args: bool = False  # its arguments hold credential references (sagaplane.credentials)
    fallback: str = ""  # the tool that completed it when its own attempts failed (sagaplane.retry)
    reason: str = ""  # the requester's words for approvers, sent with the gate call (not logged)
    reserve: str | None = None  # the estimate the gate reserves (sagaplane.reservations)
    reservation_id: str = ""  # the reservation the gate opened for it
    actual: str | None = None  # what sp.settle() said it really cost

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.saga_id, self.step_id, "compensate")

    @property
    def needs_fsync(self) -> bool:
        """Its intent is on disk before the effect runs (the effect cannot simply be undone)."""
        return self.semantics in (COMPENSABLE, IRREVERSIBLE)

    def confirm_request(self) -> ConfirmRequest:
        return ConfirmRequest(self.saga_id, self.step_id, self.tool, self.semantics, dict(self.kwargs))

    def __repr__(self) -> str:
        return f"Step(#{self.index} {self.tool} {self.semantics.value} {self.state.value})"


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
    # Retries inside the step and the tool called once they are exhausted (sagaplane.retry): a
    # ToolSpec or the name of a tool `tool()` made; `fallback_args` maps the call's arguments to the
    # fallback's (default: the same arguments).
    retry: Retry | None = None
    fallback: ToolSpec | str | None = None
    fallback_args: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # Why the agent makes this call, for the people who approve it: text, or a function of the
    # call's (bound) kwargs. Sent with the gate call; the server keeps at most 500 characters.
    reason: str | Callable[[dict[str, Any]], str] | None = None
    # The estimate the gate reserves instead of the budgets' argument, from the call's (bound)
    # kwargs; the tool settles the real amount with sp.settle(actual) (sagaplane.reservations).
    reserve: Callable[..., Any] | None = None

    def reserve_for(self, bound: dict[str, Any]) -> str | None:
        return None if self.reserve is None else reservations.amount(self.reserve(**bound), "reserve")

    def reason_for(self, bound: dict[str, Any]) -> str:
        text = self.reason(bound) if callable(self.reason) else self.reason
        return str(text or "")[:REASON_MAX]

    def __post_init__(self) -> None:
        # The signature is read once per tool, not once per call.
        self._sig: inspect.Signature | None = None
        self._positional: tuple[str, ...] | None = None  # set when the fast bind applies
        self._names: frozenset[str] = frozenset()
        self.takes_idempotency_key = False
        try:
            self._sig = inspect.signature(self.fn)
        except (TypeError, ValueError):
            return
        self.takes_idempotency_key = "idempotency_key" in self._sig.parameters
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

    def derive_compensation(self, step: Step, result: Any, *, failed: bool) -> None:
        """Set `step.compensation` from `compensate` and the forward call's result (None when the
        call raised): a fixed Compensation, or what the factory returns for this call."""
        comp = self.compensate
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
        if step.compensation is not None and step.needs_fsync and not step.compensation.recoverable:
            logger.warning(
                "step %r has an in-process-only compensation (no registered handler or non-JSON kwargs); "
                "it is unrecoverable if this process dies",
                step.tool,
            )


_TOOLS: dict[str, ToolSpec] = {}  # what `tool()` made, by name: what a `fallback="name"` finds


def resolve_tool(name: str) -> ToolSpec | None:
    return _TOOLS.get(name)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    semantics: Semantics | str,
    compensate: CompensateSpec = None,
    name: str | None = None,
    capture_state: Callable[..., Any] | None = None,
    confirm: ConfirmHook | None = None,
    retry: Retry | None = None,
    fallback: Callable[..., Any] | str | None = None,
    reason: str | Callable[[dict[str, Any]], str] | None = None,
    reserve: Callable[..., Any] | None = None,
) -> Any:
    """Wrap a tool so each call inside a saga becomes a logged, compensable step.

    `compensate` is a factory over the forward result: `lambda result: sp.undo("x.refund", id=result["id"])`
    (it may also accept `state=` for the captured snapshot and `kwargs=` for the call's arguments),
    a fixed `Compensation`, or None for "no inverse". `retry=sp.Retry(...)` retries the call inside
    the step; `fallback=` (another tool made by `tool()`, or its name) is called with the same
    arguments once the attempts are exhausted (sagaplane.retry). Outside a saga the tool runs untouched.
    `reason` is why the agent makes the call, shown first to whoever must approve it: text, or a
    function of the call's arguments (`reason=lambda kw: f"invoice {kw['invoice']}"`).
    `reserve=lambda **kw: estimate` reserves the estimate at the gate instead of the budgets'
    argument; the tool settles the real cost with `sp.settle(actual)` (sagaplane.reservations).
    """
    sem = Semantics(semantics)
    then: ToolSpec | str | None = None
    if isinstance(fallback, str):
        then = fallback
    elif fallback is not None:
        then = getattr(fallback, "sagaplane_spec", None)
        if not isinstance(then, ToolSpec):
            raise TypeError("fallback: a tool made by sp.tool(), or the name of one")

    def decorate(target: Callable[..., Any]) -> Callable[..., Any]:
        spec = ToolSpec(
            target,
            name or str(getattr(target, "__name__", "tool")),
            sem,
            compensate,
            capture_state,
            confirm,
            retry=retry,
            fallback=then,
            reason=reason,
            reserve=reserve,
        )
        _TOOLS[spec.name] = spec
        wrapped = _wrap(target, spec)
        wrapped.sagaplane_spec = spec  # type: ignore[attr-defined]
        return wrapped

    return decorate(fn) if fn is not None else decorate


def _wrap(target: Callable[..., Any], spec: ToolSpec) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(target):

        @functools.wraps(target)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            active = active_saga.get()
            if active is None:
                args, kwargs = _resolved(args, kwargs)
                return await target(*args, **kwargs)
            return await active.run_step_async(spec, args, kwargs)

        return awrapper

    @functools.wraps(target)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        active = active_saga.get()
        if active is None:
            args, kwargs = _resolved(args, kwargs)
            return target(*args, **kwargs)
        return active.run_step(spec, args, kwargs)

    return wrapper


def _resolved(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Outside a saga nothing is recorded: references are simply resolved for the call."""
    resolved = Resolved()
    return resolved.resolve(args), resolved.resolve(kwargs)
