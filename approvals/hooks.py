"""What the approvals app tells the apps built on it (the Slack app, notifiers), without importing
them: they subscribe from their `AppConfig.ready`.

`on_approval_event(hook)`: `hook(event)` runs once the transaction that made the change has
committed (best effort, `core.postcommit.after_commit`: a failure is logged and never
changes what was decided). Kinds:

- `created`: a request was opened (`event.request` is its JSON, as the API shows it);
- `voted`: a vote was counted (`event.detail`: voter, choice, break_glass);
- `decided`: approved, denied or expired (`event.request["status"]`);
- `warned`: the request expires in `event.detail["expires_in"]` seconds and is still open;
- `escalated`: it reached escalation level `event.detail["level"]` (who is asked now:
  `event.detail["roles"]`, `event.detail["members"]`);
- `consumed`: the gate authorised its effect (`event.detail["authorization_id"]`).

Registering the same function twice registers it once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from core.postcommit import after_commit

if TYPE_CHECKING:
    from tenants.models import Tenant

Kind = Literal["created", "voted", "decided", "warned", "escalated", "consumed"]


@dataclass(frozen=True)
class ApprovalEvent:
    tenant: Tenant
    kind: Kind
    request: dict[str, Any]
    detail: dict[str, Any] = field(default_factory=dict)


ApprovalHook = Callable[[ApprovalEvent], None]

_hooks: list[ApprovalHook] = []


def on_approval_event(hook: ApprovalHook) -> ApprovalHook:
    if hook not in _hooks:
        _hooks.append(hook)
    return hook


def emit(event: ApprovalEvent) -> None:
    """Called by approvals.services only, inside the change's transaction."""
    for hook in list(_hooks):
        name = getattr(hook, "__qualname__", repr(hook))
        after_commit(f"approval hook {name} ({event.kind})", lambda hook=hook: hook(event))  # type: ignore[misc]
