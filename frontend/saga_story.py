"""What a saga's timeline tells beyond its records' order (issue 29, item 4): when each step ran
and for how long, the gate's decisions and the approvals on their steps, the steps the gate or the
SDK refused (they never reach the projection's step list: their records are all there is), the
abort's cause and the rollback's report as sentences, not JSON.

`enrich` works on the timeline's context as `frontend.saga_views` builds it; the approvals are
read through `approvals.selectors`, as the API reads them. `find` is the saga list's search by id
(Stripe-style: paste an id, land on it)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from sagaplane.events import Event

from approvals import selectors as approval_selectors
from frontend.views import MemberRequest, member_page
from sagas import selectors as saga_selectors
from tenants.access import READ

GATE_EVENTS = frozenset({Event.GATE_ALLOW, Event.GATE_DENY, Event.STEP_REFUSED})
REFUSALS = frozenset({Event.GATE_DENY, Event.STEP_REFUSED})


def duration_text(seconds: float | None) -> str:
    """`0.85` -> "850 ms", `3.21` -> "3.2 s", `125` -> "2 min 5 s", `3780` -> "1 h 3 min"."""
    if seconds is None or seconds < 0:
        return ""
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


@dataclass
class RefusedStep:
    """A call stopped before it ran: by the gate (GATE_DENY) or by the SDK itself (STEP_REFUSED:
    its own view of a halt, or no confirmation for an IRREVERSIBLE step)."""

    record: Any  # frontend.saga_views.RecordView
    by: str  # "the gate" or "the agent's SDK"
    reason: str
    tool: str


def _text(value: Any, limit: int = 300) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _timing(item: Any) -> None:
    """The step's first and last forward records: when it started, how long it took."""
    moments = [r.when for r in item.records if r.when is not None and r.event not in GATE_EVENTS]
    item.started = min(moments) if moments else None
    ended: datetime | None = max(moments) if len(moments) > 1 else None
    item.duration = duration_text((ended - item.started).total_seconds()) if ended and item.started else ""


def _approval(row: Any) -> dict[str, Any]:
    return {
        "id": row.pk,
        "status": row.status,
        "approvals": row.approvals,
        "required": row.required,
        "decided_by": row.decided_by,
        "policy": row.policy_name,
    }


def _cause(record: Any) -> dict[str, str] | None:
    if record is None:
        return None
    fields = record.fields
    message = _text(fields.get("cause"), 2000) or _text(fields.get("error"), 2000)
    if not message:  # an agent of its own kind: its fields as they are, one line
        message = "; ".join(f"{k}: {v}" for k, v in fields.items() if k not in ("saga_id", "cause_type"))
    return {"type": _text(fields.get("cause_type"), 100), "message": message[:2000]}


def _report(record: Any) -> dict[str, Any] | None:
    """ROLLBACK_END as counts and a verdict (`clean`: every step it owed was undone)."""
    if record is None:
        return None
    fields = record.fields

    def count(name: str) -> int:
        value = fields.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return {
        "clean": fields.get("clean") is True,
        "halted": fields.get("halted") is True,
        "to_step": count("to_step"),
        "counts": [
            (label, count(name))
            for name, label in (
                ("compensated", "compensated"),
                ("failed", "failed"),
                ("orphaned", "orphaned"),
                ("unresolved", "unresolved"),
            )
        ],
    }


def enrich(context: dict[str, Any]) -> dict[str, Any]:
    """Adds to the timeline's context: each step's `started`, `duration`, gate records and
    `approvals`; `refused_steps`; `cause` and `rollback_report`."""
    forward = {item.step.step_id: item for item in context["forward"]}
    refused: list[RefusedStep] = []
    for view in context["saga_events"]:
        if view.event not in GATE_EVENTS:
            continue
        item = forward.get(view.step_id)
        if item is not None:
            item.records.append(view)
            if view.event in REFUSALS:
                item.denied = _text(view.fields.get("reason")) or "refused"
        elif view.event in REFUSALS:
            by = "the gate" if view.event == Event.GATE_DENY else "the agent's SDK"
            refused.append(RefusedStep(view, by, _text(view.fields.get("reason")), view.tool))
    by_step: dict[str, list[dict[str, Any]]] = {}
    for row in approval_selectors.for_saga(context["saga"].saga_id):
        by_step.setdefault(row.step_id, []).append(_approval(row))
    for item in context["forward"]:
        item.records.sort(key=lambda r: r.leaf_index)
        _timing(item)
        item.approvals = by_step.get(item.step.step_id, [])
    context["refused_steps"] = refused
    context["cause"] = _cause(context["abort_cause"])
    context["rollback_report"] = _report(context["rollback_end"])
    return context


SAGA_ID_MAX = 128


@member_page({"GET": READ}, section="sagas")
def find(request: MemberRequest) -> HttpResponse:
    """`/sagas/find?saga_id=...`: the saga's page when this tenant has it (the whole id, pasted
    with stray spaces or quotes), else back to the list saying so (another tenant's is not found)."""
    wanted = request.GET.get("saga_id", "").strip().strip("'\"`").strip()[:SAGA_ID_MAX]
    if wanted and saga_selectors.saga(wanted) is not None:
        return redirect("saga-detail", saga_id=wanted)
    messages.error(request, f"No saga with the id “{wanted}”." if wanted else "Type or paste a saga id.")
    return redirect("sagas")
