"""A gate call's body read into the gate's request: the one reading of it, shared by the gate's
view (fleet.api) and its fast route (controlplane/gate_asgi.py), so neither transport imports
the other and both refuse a body alike (DomainError 400 naming the field at fault)."""

from __future__ import annotations

from typing import Any

from core.errors import DomainError
from fleet.gate import GateRequest, amount_sent, to_units

TEXT_MAX = 200
REASON_MAX = 500  # the requester's reason, shown to approvers (ApprovalRequest.reason)


def gate_call(data: dict[str, Any], api_key_prefix: str) -> GateRequest:
    """A gate call's body as the gate's request (DomainError 400 naming the field at fault)."""
    args = data.get("args", {})
    if not isinstance(args, dict):
        raise DomainError("invalid", "args: must be a JSON object", field="args")
    if _holds_nul(args):
        # An approval request keeps the call's arguments in a jsonb column, which cannot hold NUL
        # (a 500 on Postgres), and the request is bound to their exact digest: refused, not altered.
        raise DomainError("invalid", "args: must not contain NUL (in a key or a string)", field="args")
    tags = data.get("tags", [])
    if not isinstance(tags, list) or len(tags) > 50 or not all(isinstance(t, str) and t for t in tags):
        raise DomainError("invalid", "tags: a list of at most 50 non-empty strings", field="tags")
    return GateRequest(
        saga_id=_text(data, "saga_id", limit=128),
        step_id=_text(data, "step_id", limit=128),
        tool=_text(data, "tool"),
        semantics=_text(data, "semantics", required=False, limit=32),
        args=args,
        agent=_text(data, "agent", required=False, limit=100),
        tags=tuple(tags),
        api_key_prefix=api_key_prefix,
        client_idempotency_key=_text(data, "idempotency_key", required=False),
        reason=_text(data, "reason", required=False, limit=REASON_MAX),
        reserve=_reserve(data),
    )


def _reserve(data: dict[str, Any]) -> int | None:
    """`reserve`: the estimate a reservation debits (a JSON number or a decimal string), in units."""
    if "reserve" not in data:
        return None
    try:
        return to_units(amount_sent(data["reserve"]))
    except ValueError as exc:
        raise DomainError("invalid", f"reserve: {exc}", field="reserve") from None


def _text(data: dict[str, Any], name: str, *, required: bool = True, limit: int = TEXT_MAX) -> str:
    value = data.get(name, "" if not required else None)
    if value is None or not isinstance(value, str) or (required and not value) or len(value) > limit:
        need = "a non-empty string" if required else "a string"
        raise DomainError("invalid", f"{name}: {need} of at most {limit} characters", field=name)
    if "\x00" in value:
        raise DomainError("invalid", f"{name}: must not contain NUL", field=name)
    return value


def _holds_nul(value: Any) -> bool:
    """A NUL in any string or key of a JSON value (iterative: depth costs no stack)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
