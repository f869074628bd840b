"""The gate's last step, approval, plugged in from above without fleet importing it.

`fleet` sits below `approvals` (tests/controlplane/test_layering.py): the gate knows only this
protocol, and `approvals` registers its implementation from `AppConfig.ready`. The gate calls it
inside its own transaction, so what the step writes (a new request, a consumption) commits with
the gate's decision or not at all.

Order in `fleet.services.evaluate`: kill switch → quarantine → `ApprovalStep.before_debit` (an
approval a policy requires, or one that a budget escalated earlier) → budgets and rate limits →
`ApprovalStep.escalate` when a budget with `on_cap=escalate` refused → `ApprovalStep.consume` in the
transaction that writes the authorisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from core.actors import Actor

if TYPE_CHECKING:
    from fleet.gate import Debit, GateRequest
    from tenants.models import Tenant


@dataclass(frozen=True)
class Verdict:
    """What the approval step says before anything is debited.

    - `none`: no approval concerns this call;
    - `pending`: `answer` is the gate's `pending_approval` answer;
    - `refused`: `answer` is the refusal (denied, expired, already used);
    - `approved`: go on; `requests` are to be consumed with the authorisation, and the caps of
      the budgets named in `uncapped` are lifted for this call (an approved escalation);
    - `consumed`: every request was used by an earlier gate call: only a retry of that very call
      (same idempotency key) gets its authorisation back, anything else is refused."""

    kind: Literal["none", "pending", "refused", "approved", "consumed"]
    answer: dict[str, Any] = field(default_factory=dict)
    requests: tuple[str, ...] = ()
    uncapped: frozenset[str] = frozenset()


NONE = Verdict("none")


class ApprovalStep(Protocol):
    def governed_tools(self) -> list[str]:
        """Tool globs some approval policy covers (the SDK asks the gate before these)."""
        ...

    def before_debit(self, tenant: Tenant, request: GateRequest, *, escalating: bool) -> Verdict:
        """`escalating`: some budget with on_cap=escalate covers this tool (an approved escalation
        may exist for the call); without it, and without a policy, nothing need be read."""
        ...

    def escalate(self, tenant: Tenant, request: GateRequest, limit: str, debits: Sequence[Debit]) -> Verdict:
        """A budget with on_cap=escalate refused the call: open (or find) its request."""
        ...

    def consume(
        self, tenant: Tenant, requests: Sequence[str], *, authorization_id: str, actor: Actor
    ) -> bool:
        """Mark the approved requests used by this authorisation (False: one is no longer usable,
        the caller must refuse and roll back)."""
        ...


_step: ApprovalStep | None = None


def register_approval_step(step: ApprovalStep) -> None:
    global _step
    _step = step


def approval_step() -> ApprovalStep | None:
    return _step
