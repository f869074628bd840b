"""The kill switches' history and the gate's refusals, filterable (issue 29, item 3): two pages
beside the Fleet page, both read through `fleet.selectors`, keyset-paginated by `frontend.paging`
(Next, by the last row's time and id), every member (READ), the active tenant only.

- `/fleet/halts/history`: every kill switch, engaged, lifted or lapsed, by whom and why.
- `/fleet/denials/`: every refusal by tool, agent, reason, source and time range: the gate's, and
  those an agent's SDK made on its own view (a halt or open breaker in its fleet state, an
  unreachable control plane), projected from its shipped GATE_DENY records
  (`fleet.actions.agent_denials`). An IRREVERSIBLE step nobody confirmed (STEP_REFUSED) is not a
  refusal of the gate's kind: it stays on its saga's timeline (`frontend.saga_story`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from fleet import selectors
from fleet.models import Halt, Source
from frontend import paging
from frontend.fleet_views import _why
from frontend.views import MemberRequest, member_page, page
from tenants.access import READ

PAGE_SIZE = paging.PAGE_SIZE
RANGES = [
    ("1h", "Last hour", 1),
    ("24h", "Last 24 hours", 24),
    ("7d", "Last 7 days", 168),
    ("30d", "Last 30 days", 720),
]
REASONS = [
    ("halted", "Kill switch (halt)"),
    ("draining", "Kill switch (drain)"),
    ("budget_exceeded", "Budget exceeded"),
    ("rate_limited", "Rate limited"),
    ("circuit_open", "Circuit breaker open"),
    ("quarantined", "Saga quarantined"),
    ("approval_denied", "Approval denied"),
    ("approval_expired", "Approval expired"),
    ("invalid_argument", "Argument not countable"),
    ("limit_store_unavailable", "Limit store unavailable"),
    ("control_plane_unreachable", "Control plane unreachable (SDK)"),
    ("gate_unreachable", "Gate unreachable (SDK)"),
    ("not_in_policy", "Tool not in policy (SDK)"),
]
TEXT_MAX = 200


def _halt_state(halt: Halt, now: datetime) -> tuple[str, str]:
    if halt.lifted_at is not None:
        return "lifted", "Lifted"
    if halt.expires_at is not None and halt.expires_at <= now:
        return "expired", "Expired"
    return "in-force", "In force"


@member_page({"GET": READ}, section="fleet")
def halt_history(request: MemberRequest) -> HttpResponse:
    now = timezone.now()
    halts = selectors.halt_history(before=paging.cursor(request, integer_id=True), limit=PAGE_SIZE + 1)
    found = paging.links(request, {}, halts, lambda h: h.created_at, PAGE_SIZE)
    rows = [{"halt": h, "state": _halt_state(h, now)} for h in found.rows]
    context = {"rows": rows, "pages": found}
    return page(request, "frontend/halt_history.html", context, section="fleet")


def _filters(request: HttpRequest) -> dict[str, str]:
    get = request.GET
    reason = get.get("reason", "")
    since = get.get("since", "")
    source = get.get("source", "")
    return {
        "tool": get.get("tool", "").strip()[:TEXT_MAX],
        "agent": get.get("agent", "").strip()[:TEXT_MAX],
        "reason": reason if reason in dict(REASONS) else "",
        "source": source if source in Source.values else "",
        "since": since if since in {r[0] for r in RANGES} else "",
    }


@member_page({"GET": READ}, section="fleet")
def denials(request: MemberRequest) -> HttpResponse:
    filters = _filters(request)
    hours = {key: n for key, _, n in RANGES}.get(filters["since"])
    found = selectors.denials(
        tool=filters["tool"],
        agent=filters["agent"],
        reason=filters["reason"],
        source=filters["source"],
        since=timezone.now() - timedelta(hours=hours) if hours else None,
        before=paging.cursor(request),
        limit=PAGE_SIZE + 1,
    )
    shown = paging.links(request, filters, found, lambda d: d.decided_at, PAGE_SIZE)
    context = {
        "rows": [{"d": d, "why": _why(d)} for d in shown.rows],
        "filters": filters,
        "filtered": any(filters.values()),
        "reasons": REASONS,
        "sources": Source.choices,
        "ranges": [(key, label) for key, label, _ in RANGES],
        "pages": shown,
    }
    return page(request, "frontend/denials.html", context, section="fleet")
