"""A governed tool call, framework-neutral: what the MCP gateway and the LangGraph / OpenAI Agents
adapters share. A call of a named tool with its arguments, and a callable that performs it,
becomes one step of a saga through the SDK's own step machinery (`Saga.run_step_async` /
`Saga.run_step`): the gate first (halts, budgets, rate limits, approvals), the intent written to
the WAL (fsynced before a COMPENSABLE or IRREVERSIBLE effect), the call, its outcome committed,
and the policy's compensation attached as a *registered* compensator with JSON arguments, so
that a recovery worker in another process can run it after the agent died.

API (for adapters):

    from sagaplane.integrations import core, policy

    rules = policy.load("tools.toml")
    governor = core.Governor(
        rules,
        view_result=lambda raw: raw,          # the forward result as templates read it ({result.…})
        is_error=lambda raw: False,           # a result the tool itself marks as failed
        capture=run_tool,                     # (tool, arguments) -> result, sync or async: the
    )                                         #   policy's capture calls (omit: no capture allowed)
    core.register_compensators(rules, run_tool)   # once per process: "<policy name>:<tool>"
                                                  #   handlers, (tool, arguments, key) -> result

    with sp.saga(name="run") as saga:             # or `async with`; any Saga object
        try:
            out = await governor.call(saga, "charge_card", {"amount": 5},
                                      lambda: real_call(...),       # performs the call
                                      call_id="call_abc",           # the model's tool-call id
                                      on_pending=notify)            # async (info) -> None while
        except core.Refused as refused:                             #   an approval is pending
            refused.reason, refused.message, refused.payload()
        except core.Pending as pending:                             # only with wait=False:
            pending.approval_id, pending.payload()                  #   the framework pauses
        # governor.call_sync(...) is the same for sync code (perform and capture sync).

`run_tool(tool, arguments, idempotency_key)` runs a compensation: the policy's `compensate.tool`
called with the rendered arguments; `idempotency_key` is the step's deterministic key (pass it to
the tool source when it takes one). An exception, or a result `is_error` flags, fails the attempt.

What `call` does:
- a tool the policy does not name under `default = "deny"` raises `Refused("not_in_policy")`
  (a GATE_DENY record is written; the callable is never called);
- the gate's refusals (`GateDenied`: halted, budget_exceeded, rate_limited, approval_denied,
  approval_expired, control_plane_unreachable, ...) raise `Refused` with that reason and a
  sentence a model can act on (`message`); an approval the gate waits for calls
  `on_pending({"approval_id", "expires_in", "seconds_left", "tool"})` before each long-poll, and
  an approved call runs once;
- the callable's result is returned as it is; a result `is_error` flags is returned too, the
  step recorded failed (outcome unknown, or not applied when the rule says `on_error =
  "not_applied"`); an exception from the callable is re-raised after the step is recorded
  unknown (a timeout or a crash of the tool source: the effect may have happened).
- `wait=False` (a framework that pauses for people itself: LangGraph's interrupt, the OpenAI
  Agents SDK's tool approvals): a pending approval raises `Pending` instead of being waited for;
  nothing ran. Asking again with the same `step_id` (`step_id_for(saga_id, call_id)`: a
  re-run of the same tool call) and arguments finds the same request: approved, the call runs
  once (the approval is consumed); denied or expired, `Refused`; still pending, `Pending` again.
- IRREVERSIBLE tools run once the gate allows them: the policy file is the operator's
  confirmation (pass `confirm=` to Governor to ask something else).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from typing import Any

from ..chain import token_hex
from ..credentials import Secret, SecretError
from ..gate import ApprovalPending, GateDenied, approval_listener, wait_for_approvals
from ..saga import (
    ConfirmHook,
    ConfirmRequest,
    EffectNotApplied,
    IrreversibleRefused,
    Saga,
    Step,
    ToolSpec,
    get_default_gate,
    next_step_id,
    tool_call_id,
)
from ..semantics import IRREVERSIBLE, Compensation, compensator
from .policy import Policy, TemplateError, ToolRule

Perform = Callable[..., Any]  # () -> result; (resolved arguments) -> result when the rule has `secret`
OnPending = Callable[[dict[str, Any]], Coroutine[Any, Any, None]]
RunTool = Callable[[str, dict[str, Any], str | None], Any]

_perform: ContextVar[Perform | None] = ContextVar("sagaplane_governed_perform", default=None)

SENTENCES = {
    "not_in_policy": "The tool {tool} is not allowed here: the tool policy does not name it. "
    "Do not call it again; tell the user it is not permitted.",
    "halted": "The tool {tool} is halted by an operator{why}. Do not retry it; tell the user it is "
    "stopped for now.",
    "budget_exceeded": "The tool {tool} was refused: the budget for it is spent{why}. Do not retry it "
    "in this task.",
    "rate_limited": "The tool {tool} was refused: too many calls{why}. Wait before trying it again.",
    "approval_denied": "A person refused this call of {tool}{why}. Do not repeat it; tell the user "
    "it was refused.",
    "approval_expired": "Nobody approved this call of {tool} in time. It did not run; ask the user "
    "before trying again.",
    "quarantined": "This session is quarantined by an operator: {tool} and every other tool are "
    "refused. Stop and tell the user.",
    "not_confirmed": "The tool {tool} has an effect nothing can undo and was not confirmed. It did not run.",
    "control_plane_unreachable": "The tool {tool} did not run: the safety service cannot be reached. "
    "Try again later.",
    "gate_unreachable": "The tool {tool} did not run: the safety service cannot be reached. Try again later.",
    "arguments_unresolved": "The tool {tool} did not run: its arguments lack what the policy needs{why}. "
    "Check the arguments.",
    "invalid_secret": "The tool {tool} did not run: a credential argument is not the name of one{why}.",
    "capture_failed": "The tool {tool} did not run: the state needed to undo it could not be read{why}.",
}


class Refused(Exception):
    """The call was refused before it ran: nothing was done. `message` is a sentence for a model."""

    def __init__(self, reason: str, tool: str, detail: dict[str, Any] | None = None) -> None:
        self.reason = reason
        self.tool = tool
        self.detail = dict(detail or {})
        why = self.detail.get("halt_reason") or self.detail.get("note") or self.detail.get("message") or ""
        template = SENTENCES.get(reason, "The tool {tool} was refused ({reason}){why}. It did not run.")
        self.message = template.format(tool=tool, reason=reason, why=f" ({why})" if why else "")
        super().__init__(self.message)

    def payload(self) -> dict[str, Any]:
        """The refusal as data (an MCP result's structuredContent)."""
        out: dict[str, Any] = {"refused": True, "reason": self.reason, "tool": self.tool}
        out["message"] = self.message
        for key in ("approval_id", "halt_reason", "scope", "limit", "retry_after", "saga_id", "step_id"):
            if self.detail.get(key) is not None:
                out[key] = self.detail[key]
        return out


class Pending(Exception):
    """An approval is pending for this exact call (only with `wait=False`): nothing was done."""

    def __init__(self, tool: str, arguments: dict[str, Any], answer: dict[str, Any], step: Step) -> None:
        self.tool = tool
        self.arguments = dict(arguments)
        self.answer = dict(answer)
        self.approval_id = str(answer.get("approval_id") or "")
        self.saga_id = step.saga_id
        self.step_id = step.step_id
        super().__init__(f"approval {self.approval_id} pending for {tool}")

    def payload(self) -> dict[str, Any]:
        """What a person is asked to decide, as data (an interrupt's value)."""
        out: dict[str, Any] = {
            "approval_id": self.approval_id,
            "action": {"tool": self.tool, "arguments": self.arguments},
            "saga_id": self.saga_id,
            "step_id": self.step_id,
        }
        for key in ("policy", "required", "approvals", "expires_at", "expires_in"):
            if self.answer.get(key) is not None:
                out[key] = self.answer[key]
        return out


def step_id_for(saga_id: str, call_id: str) -> str:
    """The step id of a framework's tool call in a saga: the same on every re-run of the call."""
    return hashlib.sha256(f"{saga_id}\x00{call_id}".encode()).hexdigest()[:32]


class ToolFailed(Exception):
    """Raised inside the step when the tool's own result says it failed (the result is kept)."""

    def __init__(self, result: Any) -> None:
        self.result = result
        super().__init__("the tool reported an error")


class ToolFailedNotApplied(ToolFailed, EffectNotApplied):
    """... and the policy says such a failure means nothing happened."""


class CaptureFailed(Exception):
    """The policy's capture call failed: the forward call is refused (it could not be undone)."""


def _allow(_request: ConfirmRequest) -> bool:
    return True


class Governor:
    """Turns tool calls into saga steps under one policy. Thread-safe; one per tool source."""

    def __init__(
        self,
        policy: Policy,
        *,
        view_result: Callable[[Any], Any] = lambda raw: raw,
        is_error: Callable[[Any], bool] = lambda raw: False,
        capture: Callable[[str, dict[str, Any]], Any] | None = None,
        confirm: ConfirmHook | None = None,
    ) -> None:
        self.policy = policy
        self.view_result = view_result
        self.is_error = is_error
        self.capture = capture
        self.confirm = confirm or _allow
        self._specs: dict[tuple[str, bool], ToolSpec] = {}

    def rule(self, tool: str) -> ToolRule | None:
        return self.policy.rule_for(tool)

    # -- the step's pieces, from the rule ------------------------------------------------------

    def spec(self, tool: str, *, is_async: bool = True) -> ToolSpec | None:
        """The ToolSpec of `tool` (None: refused by the policy); made once per tool."""
        key = (tool, is_async)
        spec = self._specs.get(key)
        if spec is not None:
            return spec
        rule = self.rule(tool)
        if rule is None:
            return None
        spec = _GovernedSpec(
            self._perform_async(rule) if is_async else self._perform_sync(rule),
            tool,
            rule.semantics,
            self._compensation(rule),
            self._capture(rule),
            None if rule.semantics is not IRREVERSIBLE else self.confirm,
            self._gate_args(rule),
            retry=rule.retry,
            fallback=self._fallback(rule),
            fallback_args=_fallback_args(rule),
            reserve=rule.estimate if rule.reserve else None,
        )
        if len(self._specs) < 10_000:  # tool names come from outside: the cache is bounded
            self._specs[key] = spec
        return spec

    def _checked(self, rule: ToolRule, out: Any) -> Any:
        if self.is_error(out):
            raise (ToolFailedNotApplied if rule.on_error == "not_applied" else ToolFailed)(out)
        rule.settle_with(self.view_result(out))  # `settle`: the actual the result names
        return out

    def _perform_async(self, rule: ToolRule) -> Callable[..., Any]:
        async def perform(**arguments: Any) -> Any:
            out = _performed(rule, arguments)
            if inspect.isawaitable(out):
                out = await out
            return self._checked(rule, out)

        return perform

    def _perform_sync(self, rule: ToolRule) -> Callable[..., Any]:
        def perform(**arguments: Any) -> Any:
            return self._checked(rule, _performed(rule, arguments))

        return perform

    def _fallback(self, rule: ToolRule) -> ToolSpec | None:
        """The policy's fallback as a step's fallback: another tool of this source, called through
        the integration's `capture` callable (which runs a tool of the source), governed by its own
        rule (semantics, compensation, what the gate reads)."""
        template = rule.fallback
        if template is None:
            return None
        target = self.rule(template.tool)
        if target is None:
            return None
        run = self.capture
        if run is None:
            raise ValueError(
                f"{self.policy.path}:{rule.line}: tools.{rule.pattern} has a fallback; "
                "this integration was given no way to call it"
            )

        def call(**arguments: Any) -> Any:
            out = run(template.tool, arguments)
            if inspect.isawaitable(out):
                pending = out

                async def checked() -> Any:
                    return self._checked(target, await pending)

                return checked()
            return self._checked(target, out)

        return _GovernedSpec(
            call,
            template.tool,
            target.semantics,
            self._compensation(target),
            None,
            None if target.semantics is not IRREVERSIBLE else self.confirm,
            self._gate_args(target),
        )

    def _compensation(self, rule: ToolRule) -> Callable[..., Any] | None:
        template = rule.compensate
        if template is None:
            return None
        handler = self.policy.handler_name(template.tool)
        view = self.view_result

        def derive(result: Any, state: Any = None, kwargs: dict[str, Any] | None = None) -> Compensation:
            scope = {"args": kwargs or {}, "result": None if result is None else view(result), "state": state}
            return Compensation(
                handler=handler, kwargs={"arguments": template.render(scope)}, description=template.tool
            )

        return derive

    def _capture(self, rule: ToolRule) -> Callable[..., Any] | None:
        template = rule.capture
        if template is None:
            return None
        if self.capture is None:
            raise ValueError(
                f"{self.policy.path}:{rule.line}: tools.{rule.pattern} has a capture; "
                "this integration was given no way to call it"
            )
        run, view, is_error = self.capture, self.view_result, self.is_error

        def checked(out: Any) -> Any:
            if is_error(out):
                raise CaptureFailed(f"{template.tool} answered with an error")
            return view(out)

        def capture(**arguments: Any) -> Any:
            try:
                out = run(template.tool, template.render({"args": arguments}))
            except TemplateError:
                raise
            except Exception as exc:
                raise CaptureFailed(f"{template.tool}: {exc!r}"[:500]) from exc
            if inspect.isawaitable(out):
                pending = out

                async def viewed() -> Any:
                    try:
                        return checked(await pending)
                    except CaptureFailed:
                        raise
                    except Exception as exc:
                        raise CaptureFailed(f"{template.tool}: {exc!r}"[:500]) from exc

                return viewed()
            return checked(out)

        return capture

    @staticmethod
    def _gate_args(rule: ToolRule) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        template = rule.gate_args
        if template is None:
            return None

        def gate_args(arguments: dict[str, Any]) -> dict[str, Any]:
            from .policy import render

            mapped = render(template, {"args": arguments})
            return {**arguments, **mapped}

        return gate_args

    # -- a call --------------------------------------------------------------------------------

    def _references(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments with those the rule marks `secret` as credential references (their values
        are the references' names). Raises Refused for one that is not a reference's name."""
        rule = self.rule(tool)
        if rule is None or not rule.secret:
            return arguments
        out = dict(arguments)
        for name in rule.secret:
            if name in out and not isinstance(out[name], Secret):
                try:
                    out[name] = Secret(out[name])
                except SecretError as exc:
                    raise Refused("invalid_secret", tool, {"message": f"argument {name!r}: {exc}"}) from None
        return out

    def refuse_unlisted(self, saga: Saga, tool: str, arguments: dict[str, Any]) -> Refused:
        """Record the refusal of a tool the policy does not allow (GATE_DENY) and return it."""
        step = Step(0, token_hex(16), saga.saga_id, tool, IRREVERSIBLE, dict(arguments))
        message = f"the policy {self.policy.name!r} does not name {tool!r} and its default is deny"
        saga._gate_denied(step, GateDenied("not_in_policy", {"message": message}))
        return Refused("not_in_policy", tool, {"saga_id": saga.saga_id, "step_id": step.step_id})

    async def preflight(
        self, saga: Saga, tool: str, arguments: dict[str, Any], *, step_id: str
    ) -> Pending | None:
        """Would this call (this step id and arguments) wait for people? Asks the gate as the call
        will, without waiting and without recording anything: `Pending` when an approval is pending
        (the framework pauses for it), None otherwise (the call itself is then asked again; the
        gate answers the same call with the same authorisation, debiting once)."""
        spec = self.spec(tool, is_async=True)
        gate = get_default_gate()
        if spec is None or gate is None:
            return None
        tokens = (next_step_id.set(step_id), wait_for_approvals.set(False))
        try:  # the arguments as the call will have them (its secret ones as references)
            step = saga._new_step(spec, (), self._references(tool, arguments))
            await asyncio.to_thread(gate.check, saga._gate_call(step))
        except ApprovalPending as pending:
            return _pending(saga, tool, arguments, pending, step_id)
        except (GateDenied, TemplateError, Refused, SecretError):
            return None  # refused: the call itself records the refusal and answers with it
        finally:
            wait_for_approvals.reset(tokens[1])
            next_step_id.reset(tokens[0])
        return None

    async def call(
        self,
        saga: Saga,
        tool: str,
        arguments: dict[str, Any],
        perform: Perform,
        *,
        call_id: str = "",
        on_pending: OnPending | None = None,
        step_id: str = "",
        wait: bool = True,
    ) -> Any:
        """One governed call (see the module docstring). Raises Refused when it did not run."""
        spec = self.spec(tool, is_async=True)
        if spec is None:
            raise self.refuse_unlisted(saga, tool, arguments)
        arguments = self._references(tool, arguments)
        listener = None
        if on_pending is not None:
            listener = _threadsafe_listener(tool, on_pending, asyncio.get_running_loop())
        scope = _CallScope(perform, call_id, listener, step_id, wait)
        try:
            return await saga.run_step_async(spec, (), dict(arguments))
        except ToolFailed as failed:
            return failed.result
        except ApprovalPending as pending:
            raise _pending(saga, tool, arguments, pending, step_id) from None
        except (GateDenied, IrreversibleRefused, TemplateError, CaptureFailed, SecretError) as exc:
            raise _refusal(tool, exc) from None
        finally:
            scope.reset()

    def call_sync(
        self,
        saga: Saga,
        tool: str,
        arguments: dict[str, Any],
        perform: Perform,
        *,
        call_id: str = "",
        on_pending: Callable[[dict[str, Any]], None] | None = None,
        step_id: str = "",
        wait: bool = True,
    ) -> Any:
        """`call` for synchronous code: `perform` (and the policy's captures) are synchronous."""
        spec = self.spec(tool, is_async=False)
        if spec is None:
            raise self.refuse_unlisted(saga, tool, arguments)
        arguments = self._references(tool, arguments)
        listener = None
        if on_pending is not None:
            pending_cb = on_pending

            def listener(pending: dict[str, Any], left: float) -> None:
                pending_cb(_pending_info(tool, pending, left))

        scope = _CallScope(perform, call_id, listener, step_id, wait)
        try:
            return saga.run_step(spec, (), dict(arguments))
        except ToolFailed as failed:
            return failed.result
        except ApprovalPending as pending:
            raise _pending(saga, tool, arguments, pending, step_id) from None
        except (GateDenied, IrreversibleRefused, TemplateError, CaptureFailed, SecretError) as exc:
            raise _refusal(tool, exc) from None
        finally:
            scope.reset()


class _CallScope:
    """The context variables one governed call sets for the step machinery (and resets after)."""

    def __init__(
        self,
        perform: Perform,
        call_id: str,
        listener: Callable[[dict[str, Any], float], None] | None,
        step_id: str,
        wait: bool,
    ) -> None:
        self.tokens = (
            _perform.set(perform),
            tool_call_id.set(call_id),
            approval_listener.set(listener),
            next_step_id.set(step_id),
            wait_for_approvals.set(wait),
        )

    def reset(self) -> None:
        wait_for_approvals.reset(self.tokens[4])
        next_step_id.reset(self.tokens[3])
        approval_listener.reset(self.tokens[2])
        tool_call_id.reset(self.tokens[1])
        _perform.reset(self.tokens[0])


def _performed(rule: ToolRule, arguments: dict[str, Any]) -> Any:
    """Call the integration's `perform`: with the arguments as resolved for this attempt when the
    rule marks some as secret (the resolved credentials reach the tool), else as it is."""
    call = _perform.get()
    assert call is not None
    return call(arguments) if rule.secret else call()


def _fallback_args(rule: ToolRule) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    template = rule.fallback
    if template is None or rule.fallback_same_arguments:
        return None
    return lambda arguments: template.render({"args": arguments})


def _pending(saga: Saga, tool: str, arguments: dict[str, Any], exc: ApprovalPending, step_id: str) -> Pending:
    step = Step(0, step_id, saga.saga_id, tool, IRREVERSIBLE, dict(arguments))
    return Pending(tool, arguments, exc.answer, step)


class _GovernedSpec(ToolSpec):
    """A ToolSpec whose step kwargs are the call's arguments as given (any names, no signature)."""

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return kwargs


def _pending_info(tool: str, pending: dict[str, Any], left: float) -> dict[str, Any]:
    return {
        "tool": tool,
        "approval_id": pending.get("approval_id"),
        "expires_in": pending.get("expires_in"),
        "seconds_left": round(left, 1),
    }


def _threadsafe_listener(
    tool: str, on_pending: OnPending, loop: asyncio.AbstractEventLoop
) -> Callable[[dict[str, Any], float], None]:
    """The gate waits in a worker thread; the notification is sent on the caller's loop."""

    def listener(pending: dict[str, Any], left: float) -> None:
        asyncio.run_coroutine_threadsafe(on_pending(_pending_info(tool, pending, left)), loop)

    return listener


def _refusal(tool: str, exc: BaseException) -> Refused:
    if isinstance(exc, GateDenied):
        return Refused(exc.reason, tool, exc.answer)
    if isinstance(exc, IrreversibleRefused):
        return Refused("not_confirmed", tool, {"message": exc.reason})
    if isinstance(exc, TemplateError):  # gate_args (or a capture's arguments) name what is not there
        return Refused("arguments_unresolved", tool, {"message": str(exc)})
    if isinstance(exc, CaptureFailed):
        return Refused("capture_failed", tool, {"message": str(exc)})
    if isinstance(exc, SecretError):  # a literal reference in the arguments
        return Refused("invalid_secret", tool, {"message": str(exc)})
    return Refused("refused", tool, {"message": str(exc)})


def register_compensators(policy: Policy, run: RunTool) -> list[str]:
    """Register one compensator per tool the policy's compensations call, named
    `<policy name>:<tool>`: `handler(arguments, idempotency_key=None)` calls `run(tool, arguments,
    idempotency_key)`. An async `run` gets async handlers (a rollback in this process awaits them)."""
    names = []
    for tool in policy.compensation_tools():
        name = policy.handler_name(tool)
        compensator(name)(_handler(tool, run))
        names.append(name)
    return names


def _handler(tool: str, run: RunTool) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(run):

        async def handler(arguments: dict[str, Any], idempotency_key: str | None = None) -> Any:
            return await run(tool, dict(arguments), idempotency_key)

        return handler

    def handler(arguments: dict[str, Any], idempotency_key: str | None = None) -> Any:  # type: ignore[no-redef]
        return run(tool, dict(arguments), idempotency_key)

    return handler


__all__ = ["Governor", "Pending", "Refused", "ToolFailed", "register_compensators", "step_id_for"]
