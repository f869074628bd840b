"""The agent's side of the pre-flight gate.

Before a step's effect, `Gate.check` decides, failing closed:
1. the fleet state (halts in force, which tools a budget or rate limit governs) comes from one
   long-poll of `GET /api/v1/fleet/status` kept open in a background thread, so a halt reaches a
   running agent within about a second. When the control plane cannot be read, the last state is
   trusted for `grace` seconds (default 30), then every effect is refused (`control_plane_unreachable`);
   a state never read is no state: refused until the first answer;
2. a halt in force that matches the call refuses it here, with no round-trip, and so does an
   open circuit breaker whose tool glob matches it (`circuit_open`: the control plane opened it
   fleet-wide from every agent's failures); a half-open one makes the call governed, so the gate
   decides whether it is the one trial call;
3. a call some limit governs (or any call while a drain is in force: only the server knows which
   sagas were running before it) is asked of `POST /api/v1/gate/evaluate`; an unreachable gate
   refuses;
4. everything else is allowed locally: an ungoverned call costs no round-trip.

When the gate answers `pending_approval` (an approval policy matched, or a budget escalated), the
call waits for the named humans: `GET /api/v1/approvals/<id>/wait` long-polls (at most 25 s a
call, looped until the request's deadline), returns within about a second of the deciding vote,
and the gate is asked again — that second answer consumes the approval in the transaction that
authorises the effect, so one approval starts one effect. Denial, the deadline, and a control
plane that cannot be reached while waiting all refuse (`GateDenied`).

Every answer the server gave is recorded in the WAL (`GATE_ALLOW` with the authorisation id,
`GATE_DENY` with the reason) beside the step it concerns.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .client import Client, SagaplaneError, TransportError
from .leases import LeaseHolder
from .names import glob_matches, same_name

logger = logging.getLogger("sagaplane.gate")

DEFAULT_GRACE_S = 30.0
POLL_WAIT_S = 20.0
APPROVAL_WAIT_S = 20.0  # per long-poll call (the server waits at most 25)
MAX_APPROVAL_WAIT_S = 7 * 24 * 3600.0
FIRST_STATE_WAIT_S = 5.0
GUARANTEES_VERSION = "2026-12-06"

# Set by an integration around one call (the MCP gateway sends progress notifications from it):
# called with the pending answer and the seconds left before each long-poll of an approval wait.
approval_listener: ContextVar[Callable[[dict[str, Any], float], None] | None] = ContextVar(
    "sagaplane_approval_listener", default=None
)
# Set to False by an integration whose framework pauses for humans itself (LangGraph's interrupt,
# the OpenAI Agents SDK's tool approvals): a pending approval raises ApprovalPending instead of
# being waited for here; the same call asked again later (same saga, step and arguments) finds the
# same request and, once it is approved, consumes it.
wait_for_approvals: ContextVar[bool] = ContextVar("sagaplane_wait_for_approvals", default=True)


class GateDenied(SagaplaneError):
    """The gate refused this call before its effect: nothing was done, nothing debited."""

    def __init__(self, reason: str, answer: dict[str, Any] | None = None) -> None:
        self.reason = reason
        self.answer = dict(answer or {})
        detail = (
            self.answer.get("halt_reason") or self.answer.get("message") or self.answer.get("limit") or ""
        )
        super().__init__(f"gate denied: {reason}" + (f" ({detail})" if detail else ""))


class ApprovalPending(SagaplaneError):
    """The call waits for people (`wait_for_approvals` is off): nothing was done. `answer` is the gate's
    pending answer (approval_id, expires_in, policy, required, ...)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = dict(answer)
        super().__init__(f"approval {self.answer.get('approval_id')} pending")


@dataclass(frozen=True)
class Call:
    saga_id: str
    step_id: str
    tool: str
    semantics: str
    args: dict[str, Any]
    agent: str = ""
    tags: Sequence[str] = ()
    reason: str = ""  # shown to approvers (sp.tool(..., reason=)); not part of the call's identity
    reserve: str | None = None  # the estimate reserved instead of the budgets' argument


@dataclass
class FleetState:
    halts: list[dict[str, Any]] = field(default_factory=list)
    governed_tools: list[str] = field(default_factory=list)
    breakers: list[dict[str, Any]] = field(default_factory=list)  # open or half-open
    version: str = ""
    read_at: float | None = None  # time.monotonic() of the last answer; None: never read
    quarantined: frozenset[str] = frozenset()
    quarantined_truncated: bool = False


def _halt_matches(scope: str, call: Call) -> bool:
    kind, _, value = scope.partition(":")
    if scope == "*":
        return True
    if kind == "tool":  # matched as the control plane matches (sagaplane.names)
        return glob_matches(value, call.tool)
    if kind == "tag":
        return any(same_name(value, tag) for tag in call.tags)
    if kind == "agent":
        return same_name(value, call.agent)
    return False


class Gate:
    """One per process (`sagaplane.configure` makes it). Thread-safe."""

    def __init__(
        self,
        url: str | None,
        api_key: str | None,
        *,
        grace: float = DEFAULT_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        poll_wait: float = POLL_WAIT_S,
        approval_wait: float = APPROVAL_WAIT_S,
        leases: bool = False,
    ) -> None:
        """`leases`: decide calls within budget leases held in process (`sagaplane.leases`)."""
        self.grace = grace
        self.clock = clock
        self.poll_wait = poll_wait
        self.approval_wait = approval_wait
        self._ask = Client(url, api_key, timeout=10.0)
        self._poll = Client(url, api_key, timeout=poll_wait + 15.0)
        # Approval long-polls (the client keeps one connection per thread: waiters do not share).
        self._wait = Client(url, api_key, timeout=approval_wait + 15.0)
        self.leases = LeaseHolder(self._ask) if leases else None
        self._state = FleetState()
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the background long-poll ----------------------------------------------------------------

    def start(self) -> Gate:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sagaplane-gate", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        if self.leases is not None:
            self.leases.revoke()  # given back with what was used
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        for client in (self._ask, self._poll, self._wait):
            try:
                client.close()
            except OSError:
                pass

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            since = self._state.version
            path = "/api/v1/fleet/status"
            if since:
                path += "?" + urllib.parse.urlencode({"since": since, "wait": self.poll_wait})
            try:
                response = self._poll.get(path)
            except TransportError as exc:
                response = None
                logger.debug("fleet status unreachable: %s", exc)
            if response is not None and response.ok and isinstance(response.body, dict):
                self._adopt(response.body)
                failures = 0
                if since and self._state.version == since:
                    # Unchanged: a real server answers so only when its wait ran out; one that
                    # ignores `wait` must not be asked in a tight loop.
                    self._stop.wait(0.5)
                continue
            if response is not None and not response.ok:
                logger.warning("fleet status refused: %s %s", response.status, response.error_code)
            failures += 1
            # Back off (up to 2 s) without sleeping through a close().
            self._stop.wait(min(2.0, 0.1 * 2**failures))

    def _adopt(self, body: dict[str, Any]) -> None:
        state = FleetState(
            halts=[h for h in body.get("halts", []) if isinstance(h, dict)],
            governed_tools=[t for t in body.get("governed_tools", []) if isinstance(t, str)],
            breakers=[b for b in body.get("breakers", []) if isinstance(b, dict)],
            version=str(body.get("version", "")),
            read_at=self.clock(),
            quarantined=frozenset(q for q in body.get("quarantined", []) if isinstance(q, str)),
            quarantined_truncated=bool(body.get("quarantined_truncated", False)),
        )
        with self._changed:
            changed = self._state.version not in ("", state.version)
            self._state = state
            self._changed.notify_all()
        if changed and self.leases is not None:
            # A halt, a limit or a quarantine changed: no lease granted before it decides a call.
            self.leases.revoke()

    def refresh(self) -> None:
        """Read the fleet state now (once), in this thread."""
        try:
            response = self._poll.get("/api/v1/fleet/status")
        except TransportError:
            return
        if response.ok and isinstance(response.body, dict):
            self._adopt(response.body)

    # -- what the agent asks -----------------------------------------------------------------------

    def state(self) -> FleetState:
        """The last fleet state, waiting (briefly) for the first one."""
        with self._changed:
            if self._state.read_at is None and not self._stop.is_set():
                self._changed.wait_for(lambda: self._state.read_at is not None, timeout=FIRST_STATE_WAIT_S)
            return self._state

    def status(self) -> dict[str, Any]:
        """May this agent act now? `ready` only with a fresh fleet state and no fleet-wide halt."""
        state = self.state()
        if state.read_at is None or self.clock() - state.read_at > self.grace:
            age = None if state.read_at is None else round(self.clock() - state.read_at, 3)
            return {"ready": False, "state": "unknown", "halts": state.halts, "state_age_s": age}
        everything = [h for h in state.halts if h.get("scope") == "*" and h.get("mode") == "halt"]
        return {
            "ready": not everything,
            "state": "halted" if everything else "ready",
            "halts": state.halts,
            "state_age_s": round(self.clock() - state.read_at, 3),
        }

    def check(self, call: Call) -> dict[str, Any] | None:
        """None when the call may go ahead without asking; the server's allow answer when it was
        asked; raises GateDenied otherwise (including every case where nobody can say)."""
        state = self.state()
        if state.read_at is None:
            raise GateDenied("control_plane_unreachable", {"message": "the fleet state was never read"})
        if self.clock() - state.read_at > self.grace:
            raise GateDenied(
                "control_plane_unreachable", {"message": f"fleet state older than the {self.grace:g} s grace"}
            )
        draining = False
        for halt in state.halts:
            if not _halt_matches(str(halt.get("scope", "")), call):
                continue
            if halt.get("mode") == "drain":
                draining = True
                continue
            raise GateDenied("halted", {"scope": halt.get("scope"), "halt_reason": halt.get("reason")})
        governed = any(glob_matches(glob, call.tool) for glob in state.governed_tools)
        trial = False
        for breaker in state.breakers:
            if not glob_matches(str(breaker.get("tool", "")), call.tool):
                continue
            if breaker.get("state") != "open":  # half-open: the gate picks the one trial call
                governed = trial = True
                continue
            name = breaker.get("name")
            raise GateDenied(
                "circuit_open",
                {
                    "breaker": name,
                    "scope": f"tool:{breaker.get('tool')}",
                    "message": f"circuit breaker '{name}' is open",
                },
            )
        if not governed and not draining:
            return None
        # A budget lease decides in process, but never for a saga set aside, nor while a drain
        # (only the server knows which sagas ran before it), a breaker's trial or an unnamed
        # quarantine may apply.
        leasing = (
            not (draining or trial or state.quarantined_truncated or call.reserve is not None)
            and call.saga_id not in state.quarantined
        )
        if self.leases is not None and leasing:
            held = self.leases.decide(call.saga_id, call.tool, call.agent, call.args)
            if held is not None:
                return held
        body = {
            "saga_id": call.saga_id,
            "step_id": call.step_id,
            "tool": call.tool,
            "semantics": call.semantics,
            "args": call.args,
            "agent": call.agent,
            "tags": list(call.tags),
        }
        if call.reason:
            body["reason"] = call.reason
        if call.reserve is not None:
            body["reserve"] = call.reserve
        answer = self._evaluate(body)
        if answer.get("decision") == "pending_approval":
            if not wait_for_approvals.get():
                raise ApprovalPending(answer)
            self._await_approval(answer)
            # Approved: ask again. This answer consumes the approval with the authorisation (a
            # retry of the same call gets the same authorisation back; anything else is refused).
            answer = self._evaluate(body)
        if answer.get("decision") == "allow":
            return answer
        raise GateDenied(str(answer.get("reason") or answer.get("decision") or "denied"), answer)

    def halt_for(self, call: Call) -> dict[str, Any] | None:
        """The halt in force that stops `call` (a drain does not), from the last fleet state the
        long-poll brought: no round-trip. What a step's retries check between attempts."""
        for halt in self._state.halts:
            if halt.get("mode") != "drain" and _halt_matches(str(halt.get("scope", "")), call):
                return halt
        return None

    def approval_status(self, approval_id: str, wait: float = 0.0) -> dict[str, Any]:
        """An approval request's state (`status`: pending, approved, denied, expired, consumed...),
        waiting at most `wait` seconds for a decision. Raises GateDenied when it cannot be read."""
        if not approval_id.isalnum() or len(approval_id) > 64:
            raise GateDenied("approval_unknown", {"approval_id": approval_id})
        timeout = round(min(max(wait, 0.0), self.approval_wait), 3)
        path = f"/api/v1/approvals/{approval_id}/wait?" + urllib.parse.urlencode({"timeout": timeout})
        try:
            response = self._wait.get(path)
        except TransportError as exc:
            raise GateDenied("control_plane_unreachable", {"message": str(exc)}) from None
        state = response.body if isinstance(response.body, dict) else {}
        if not response.ok:
            raise GateDenied(str(state.get("error") or f"http_{response.status}"), state)
        return state

    def _evaluate(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            # Safe to resend on a connection the server closed while idle (after a long approval
            # wait, typically): the gate answers a retried call with its first answer, debiting once.
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            response = self._ask.request_raw("POST", "/api/v1/gate/evaluate", data, idempotent=True)
        except TransportError as exc:
            raise GateDenied("gate_unreachable", {"message": str(exc)}) from None
        answer = response.body if isinstance(response.body, dict) else {}
        if not response.ok:
            raise GateDenied(str(answer.get("error") or f"http_{response.status}"), answer)
        return answer

    def _await_approval(self, pending: dict[str, Any]) -> None:
        """Long-poll the request until it is approved (returns), or refuse: denied, expired, its
        deadline passed on this clock, or the control plane unreachable. The deadline is the
        server's `expires_in` counted on this process' monotonic clock (no wall-clock skew)."""
        approval_id = str(pending.get("approval_id") or "")
        if not approval_id.isalnum() or len(approval_id) > 64:
            raise GateDenied("approval_unknown", pending)
        try:
            left = float(pending.get("expires_in") or 0)
        except (TypeError, ValueError):
            left = 0.0
        deadline = time.monotonic() + min(max(left, 0.0), MAX_APPROVAL_WAIT_S)
        logger.info("waiting for approval %s (%.0f s left)", approval_id, left)
        listener = approval_listener.get()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise GateDenied(
                    "approval_expired", {**pending, "message": "no decision before the deadline"}
                )
            if listener is not None:
                try:
                    listener(pending, remaining)
                except Exception:  # a listener never changes what the gate decides
                    logger.debug("approval listener raised", exc_info=True)
            timeout = round(min(self.approval_wait, remaining + 0.5), 3)
            path = f"/api/v1/approvals/{approval_id}/wait?" + urllib.parse.urlencode({"timeout": timeout})
            try:
                response = self._wait.get(path)
            except TransportError as exc:
                raise GateDenied("control_plane_unreachable", {**pending, "message": str(exc)}) from None
            state = response.body if isinstance(response.body, dict) else {}
            if not response.ok:
                raise GateDenied(str(state.get("error") or f"http_{response.status}"), {**pending, **state})
            status = state.get("status")
            if status == "approved":
                return
            if status == "pending":
                continue
            reason = {"denied": "approval_denied", "expired": "approval_expired"}.get(
                str(status), "approval_expired"
            )
            raise GateDenied(reason, {**pending, **state})


def guarantees() -> dict[str, Any]:
    """What this SDK enforces before an effect, and what it does not claim (versioned)."""
    return {
        "version": GUARANTEES_VERSION,
        "enforced_before_effect": [
            "every step of a saga is written to the local WAL (fsynced for COMPENSABLE and IRREVERSIBLE) "
            "before its effect runs",
            "a kill switch (halt) in force for the call's tool, tag or agent refuses it",
            "an open fleet-wide circuit breaker matching the call's tool refuses it; a half-open one lets "
            "only the one trial call the control plane picks through",
            "a call some budget or rate limit governs runs only after the control plane authorised it: "
            "one atomic check-and-debit across every matching limit, on the server's clock",
            "a call an approval policy matches (or a budget escalates) runs only after the named humans "
            "approved that exact action (SHA-256 of tool, arguments, amount and policy version); the "
            "approval is consumed by the authorisation, so it starts one effect, inside its execution "
            "window; a denial, the deadline or an unreachable control plane while waiting refuses",
            "an IRREVERSIBLE step the control plane authorised with such an approval needs no local "
            "confirm= answer; any other IRREVERSIBLE step still does",
            "when the control plane cannot be read for longer than the grace period, every step is refused",
            "every gate answer is recorded in the WAL (GATE_ALLOW with its authorisation id, GATE_DENY "
            "with its reason)",
        ],
        "not_claimed": [
            "calls made outside a saga are not gated or logged",
            "within the grace period a halt issued while the control plane is unreachable is not yet known",
            "an ungoverned tool is allowed without asking the server (no round-trip)",
            "an effect's own success or failure is whatever the tool reports",
        ],
        "grace_s_default": DEFAULT_GRACE_S,
    }
