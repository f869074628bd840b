"""Sagas (list, detail with timeline and record inspector) and the fleet overview's saga half.

Reads only, through selectors: the saga projection (`sagas.selectors`), the stored records in WAL
form (`audit.selectors`), credentials masked by `sagas.services.mask_credentials`.
Each page has a fragment URL that app.js fetches again when a `saga.event` arrives."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import Resolver404, resolve, reverse
from django.utils import timezone

from audit import selectors as audit_selectors
from audit.models import Record
from frontend import recovery_views
from frontend.views import MemberRequest, member_page, page
from sagas import selectors
from sagas.models import Saga, SagaStatus, Step, StepStatus
from sagas.services import mask_credentials
from tenants.access import READ

NEEDS_HUMAN = (SagaStatus.ROLLBACK_PARTIAL, SagaStatus.ORPHANED)
SINCE_CHOICES = [
    ("", "Any time"),
    ("1h", "Last hour"),
    ("24h", "Last 24 hours"),
    ("7d", "Last 7 days"),
    ("30d", "Last 30 days"),
]
_SINCE = {
    "1h": timedelta(hours=1),
    "24h": timedelta(days=1),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
PAGE_SIZE = 50


# ------------------------------------------------------------------------------------------ list


@dataclass
class Filters:
    status: str = ""
    tool: str = ""
    stream: str = ""
    since: str = ""

    @classmethod
    def from_request(cls, request: HttpRequest) -> Filters:
        get = request.GET
        status = get.get("status", "")
        since = get.get("since", "")
        return cls(
            status=status if status in SagaStatus.values else "",
            tool=get.get("tool", "").strip()[:200],
            stream=get.get("stream", "").strip()[:200],
            since=since if since in _SINCE else "",
        )

    def query(self, **override: str) -> str:
        """The filters as a query string (empty ones left out), with `override` applied; a
        `page=` override adds the page."""
        values = {**self.__dict__, **override}
        return urlencode({k: v for k, v in values.items() if v})


def _without_status(filters: Filters, now: datetime) -> QuerySet[Saga]:
    return selectors.filtered(
        tool=filters.tool,
        stream_id=filters.stream,
        active_since=now - _SINCE[filters.since] if filters.since else None,
    )


@dataclass(frozen=True)
class SagaRow:
    """A saga as its list row shows it: the saga, its effective status now, whether it needs a human."""

    saga: Saga
    shown_status: str
    needs_human: bool

    @classmethod
    def of(cls, saga: Saga, now: datetime) -> SagaRow:
        status = saga.effective_status(now)
        return cls(saga, status, status in NEEDS_HUMAN)


def _list_context(request: HttpRequest) -> dict[str, Any]:
    now = timezone.now()
    filters = Filters.from_request(request)
    base = _without_status(filters, now)
    counts = selectors.effective_status_counts(base, now)
    matching = selectors.newest_first_with_step_counts(
        selectors.with_effective_status(base, filters.status, now)
    )
    # get_page answers any `page` (missing, not a number, out of range) with a real page.
    shown = Paginator(matching, PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [SagaRow.of(saga, now) for saga in shown.object_list]
    all_counts = (
        selectors.effective_status_counts(selectors.all_sagas(), now)
        if (filters.tool or filters.stream or filters.since)
        else counts
    )
    # The page is part of the address like the filters, so a refresh (and the live fragment)
    # stays where the reader is; page 1 is left out of the URL.
    here = filters.query(page=str(shown.number) if shown.number > 1 else "")
    return {
        "filters": filters,
        "sagas": rows,
        "page": shown,
        "page_links": _page_links(filters, shown),
        "status_counts": [
            {"value": value, "label": label, "n": counts[value], "query": filters.query(status=value)}
            for value, label in SagaStatus.choices
        ],
        "total": sum(counts.values()),
        "any_sagas": selectors.all_sagas().exists(),
        "needs_human": all_counts[SagaStatus.ROLLBACK_PARTIAL] + all_counts[SagaStatus.ORPHANED],
        "fragment_url": reverse("saga-rows") + ("?" + here if here else ""),
    }


def _page_links(filters: Filters, shown: Page) -> dict[str, str]:
    """Query strings (filters kept) of the first, previous, next and last pages; "" where none."""

    def at(number: int) -> str:
        return "?" + filters.query(page=str(number) if number > 1 else "")

    last = shown.paginator.num_pages
    return {
        "first": at(1) if shown.number > 1 else "",
        "previous": at(shown.previous_page_number()) if shown.has_previous() else "",
        "next": at(shown.next_page_number()) if shown.has_next() else "",
        "last": at(last) if shown.number < last else "",
    }


def _stream_choices() -> list[tuple[str, str]]:
    """(stream id, label) for the filter: the agent's name beside its stream id when it gave one."""
    agents: dict[str, str] = {}
    for stream_id, agent in selectors.stream_agents(limit=400):
        if agent or stream_id not in agents:
            agents[stream_id] = agent
    return [
        (stream_id, f"{agent} · {stream_id}" if agent else stream_id) for stream_id, agent in agents.items()
    ][:200]


@member_page({"GET": READ}, section="sagas")
def saga_list(request: MemberRequest) -> HttpResponse:
    context = _list_context(request)
    context.update(
        statuses=SagaStatus.choices,
        since_choices=SINCE_CHOICES,
        tools=selectors.step_tools(limit=200),
        streams=_stream_choices(),
    )
    return page(request, "frontend/sagas.html", context, section="sagas")


@member_page({"GET": READ}, section="sagas")
def saga_rows(request: MemberRequest) -> HttpResponse:
    return render(request, "frontend/_saga_list.html", {**_list_context(request), "caps": _caps(request)})


def _caps(request: MemberRequest) -> frozenset[str]:
    from tenants.models import ROLE_CAPABILITIES

    return ROLE_CAPABILITIES[request.membership.role]


# ---------------------------------------------------------------------------------------- detail

FORWARD_EVENTS = {"STEP_INTENT", "STEP_COMMITTED", "COMPLETED_VIA_FALLBACK", "STEP_UNKNOWN"}
BACKWARD_EVENTS = {"COMPENSATED", "COMPENSATION_FAILED", "STEP_ORPHANED"}
FORWARD_OUTCOME = {
    "STEP_INTENT": StepStatus.INTENT,
    "STEP_COMMITTED": StepStatus.COMMITTED,
    "COMPLETED_VIA_FALLBACK": StepStatus.COMMITTED,
    "STEP_UNKNOWN": StepStatus.UNKNOWN,
}
BACKWARD_OUTCOME = {
    "COMPENSATED": StepStatus.COMPENSATED,
    "COMPENSATION_FAILED": StepStatus.COMPENSATION_FAILED,
    "STEP_ORPHANED": StepStatus.ORPHANED,
}
OUTCOME_LABEL = dict(StepStatus.choices)
HIDDEN_KEYS = {"seq", "ts", "event", "_h", "_ph", "_cd", "_s", "_redacted"}


@dataclass
class RecordView:
    leaf_index: int
    position: int
    stream: str
    event: str
    seq: Any
    when: datetime | None
    chain_hash: str
    prev_hash: str
    digest: str
    redacted: str
    step_id: str
    semantics: str = ""
    arguments: str = ""
    compensation: str = ""
    other: str = ""


@dataclass
class StepView:
    step: Step
    outcome: str
    records: list[RecordView] = field(default_factory=list)
    recovery_job: Any = None  # the step's latest recovery job (frontend.recovery_views)
    rollback_here: bool = False  # offer "Rollback to here" on this step

    @property
    def outcome_label(self) -> str:
        return OUTCOME_LABEL.get(self.outcome, self.outcome)


@dataclass
class CompensationView:
    step: Step | None
    record: RecordView
    outcome: str

    @property
    def outcome_label(self) -> str:
        return OUTCOME_LABEL.get(self.outcome, self.outcome)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _record_view(record: Record, body: dict[str, Any], erased: bool) -> RecordView:
    masked = {k: mask_credentials(v, k) for k, v in body.items() if k not in HIDDEN_KEYS}
    view = RecordView(
        leaf_index=record.leaf_index,
        position=record.position,
        stream=record.stream.stream_id,
        event=record.event,
        seq=record.seq,
        when=_ts(record.ts),
        chain_hash=record.h,
        prev_hash=record.ph,
        digest=record.cd,
        redacted=body.get("_redacted", "") if erased else "",
        step_id=record.step_id,
    )
    semantics = masked.pop("semantics", "")
    view.semantics = semantics if isinstance(semantics, str) else _pretty(semantics)
    if "kwargs" in masked:
        view.arguments = _pretty(masked.pop("kwargs"))
    if "compensation" in masked:
        view.compensation = _pretty(masked.pop("compensation"))
    for key in ("saga_id", "step_id", "tool"):
        masked.pop(key, None)
    view.other = _pretty(masked) if masked else ""
    return view


def _ts(value: float) -> datetime | None:
    from datetime import UTC

    try:
        return datetime.fromtimestamp(value, tz=UTC)
    except (OverflowError, OSError, ValueError, TypeError):
        return None


def _saga_or_404(saga_id: str) -> Saga:
    # The tenant manager sees only the active tenant: another tenant's saga id is simply not found.
    saga = selectors.saga(saga_id)
    if saga is None:
        raise Http404("no such saga")
    return saga


def _url_exists(path: str) -> bool:
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


def _detail_context(request: HttpRequest, saga_id: str) -> dict[str, Any]:
    now = timezone.now()
    saga = _saga_or_404(saga_id)
    steps = selectors.steps_of(saga)
    step_by_id = {s.step_id: s for s in steps}
    views = [_record_view(r.record, r.body, r.erased) for r in audit_selectors.saga_records(saga_id)]
    forward: dict[str, StepView] = {s.step_id: StepView(step=s, outcome=StepStatus.INTENT) for s in steps}
    backward: list[CompensationView] = []
    saga_events: list[RecordView] = []
    rollback_start: RecordView | None = None
    rollback_end: RecordView | None = None
    abort_cause: RecordView | None = None
    for view in views:
        if view.event in FORWARD_EVENTS and view.step_id in forward:
            item = forward[view.step_id]
            item.records.append(view)
            item.outcome = FORWARD_OUTCOME[view.event]
        elif view.event in BACKWARD_EVENTS:
            backward.append(
                CompensationView(
                    step=step_by_id.get(view.step_id), record=view, outcome=BACKWARD_OUTCOME[view.event]
                )
            )
            if view.step_id in forward:
                forward[view.step_id].records.append(view)
        else:
            saga_events.append(view)
            if view.event == "ROLLBACK_START":
                rollback_start = view
            elif view.event == "ROLLBACK_END":
                rollback_end = view
            elif view.event == "SAGA_ABORT_CAUSE":
                abort_cause = view
    shown_status = saga.effective_status(now)
    disclosure = f"/api/v1/audit/sagas/{saga.saga_id}/disclosure"
    forward_items = [forward[s.step_id] for s in steps]
    membership = getattr(request, "membership", None)
    recovery = recovery_views.saga_recovery(membership, saga, forward_items) if membership is not None else {}
    return {
        **recovery,
        "saga": saga,
        "shown_status": shown_status,
        "needs_human": shown_status in NEEDS_HUMAN,
        "forward": forward_items,
        "backward": backward,
        "saga_events": saga_events,
        "rollback_start": rollback_start,
        "rollback_end": rollback_end,
        "abort_cause": abort_cause,
        "records": views,
        "running": shown_status == SagaStatus.RUNNING,
        "disclosure_url": disclosure if _url_exists(disclosure) else "",
        "fragment_url": reverse("saga-timeline", args=[saga.saga_id]),
        "outcomes": StepStatus.choices,
    }


@member_page({"GET": READ}, section="sagas")
def saga_detail(request: MemberRequest, saga_id: str) -> HttpResponse:
    context = _detail_context(request, saga_id)
    return page(request, "frontend/saga_detail.html", context, section="sagas")


@member_page({"GET": READ}, section="sagas")
def saga_timeline(request: MemberRequest, saga_id: str) -> HttpResponse:
    context = {**_detail_context(request, saga_id), "caps": _caps(request)}
    return render(request, "frontend/_saga_timeline.html", context)


# ----------------------------------------------------------------------------------------- fleet

FLEET_WINDOWS = [("1h", "Last hour"), ("24h", "Last 24 hours"), ("7d", "Last 7 days")]
MATRIX_OUTCOMES = [
    StepStatus.COMMITTED,
    StepStatus.COMPENSATED,
    StepStatus.COMPENSATION_FAILED,
    StepStatus.UNKNOWN,
    StepStatus.ORPHANED,
    StepStatus.INTENT,
]
SPARSE_BELOW = 5
MAX_LANES = 25
CHART_WIDTH, LABEL_WIDTH, LANE_HEIGHT, TOP, BOTTOM = 960, 170, 30, 10, 34


def _active_span(saga: Saga, now: datetime) -> tuple[datetime, datetime]:
    """When a saga began and when it was last active, as the chart draws it. The chart's sagas
    have both (the selector returns started sagas active in the window); one with neither would
    be drawn at `now`."""
    begin = saga.started_at or saga.last_activity_at or now
    return begin, saga.last_activity_at or begin


def _chart(sagas: list[Saga], start: datetime, end: datetime, now: datetime) -> dict[str, Any]:
    lanes: dict[str, list[Saga]] = defaultdict(list)
    for saga in sagas:
        lanes[saga.stream_id].append(saga)
    names = sorted(lanes, key=lambda n: max(_active_span(s, now)[1] for s in lanes[n]), reverse=True)
    names = names[:MAX_LANES]
    span = max((end - start).total_seconds(), 1.0)
    plot = CHART_WIDTH - LABEL_WIDTH - 10

    def x(moment: datetime) -> float:
        return round(LABEL_WIDTH + plot * min(max((moment - start).total_seconds() / span, 0.0), 1.0), 1)

    rows = []
    for i, name in enumerate(names):
        y = TOP + i * LANE_HEIGHT
        bars = []
        for saga in lanes[name]:
            begin, finish = _active_span(saga, now)
            status = saga.effective_status(now)
            x0, x1 = x(begin), x(finish)
            bars.append(
                {
                    "saga": saga,
                    "status": status,
                    "label": dict(SagaStatus.choices).get(status, status),
                    "x": x0,
                    "w": max(x1 - x0, 3.0),
                    "end": max(x1, x0 + 3.0),
                    "rollback": status in (SagaStatus.ROLLED_BACK, SagaStatus.ROLLBACK_PARTIAL),
                }
            )
        # The lane is the stream; it is labelled with the agent's own name when it gave one.
        agent = next((saga.agent for saga in reversed(lanes[name]) if saga.agent), "")
        label = agent or name
        rows.append(
            {
                "name": name,
                "title": f"{agent} · {name}" if agent else name,
                "short": label if len(label) <= 22 else label[:21] + "…",
                "y": y,
                "bar_y": y + 7,
                "text_y": y + 19,
                "bars": bars,
            }
        )
    height = TOP + len(names) * LANE_HEIGHT + BOTTOM
    ticks = []
    for k in range(6):
        moment = start + (end - start) * k / 5
        fmt = "%H:%M:%S" if span <= 3600 else ("%H:%M" if span <= 2 * 86400 else "%m-%d %H:%M")
        anchor = "start" if k == 0 else ("end" if k == 5 else "middle")
        ticks.append({"x": x(moment), "label": moment.strftime(fmt), "anchor": anchor})
    return {
        "rows": rows,
        "width": CHART_WIDTH,
        "height": height,
        "ticks": ticks,
        "axis_y": height - BOTTOM + 4,
        "tick_text_y": height - BOTTOM + 20,
        "label_x": 8,
        "plot_left": LABEL_WIDTH,
        "plot_right": CHART_WIDTH - 10,
        "plot_width": plot,
        "hidden_lanes": max(len(lanes) - MAX_LANES, 0),
    }


def _matrix(outcomes: list[tuple[str, str, int]]) -> dict[str, Any]:
    table: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(MATRIX_OUTCOMES, 0))
    for tool, status, n in outcomes:
        if status in MATRIX_OUTCOMES:
            table[tool or "(no tool)"][status] += n
    rows = []
    for tool in sorted(table):
        counts = table[tool]
        total = sum(counts.values())
        cells = []
        for outcome in MATRIX_OUTCOMES:
            n = counts[outcome]
            if n < SPARSE_BELOW:
                cells.append({"n": n, "sparse": True, "text": str(n), "heat": 0})
            else:
                share = n / total
                cells.append(
                    {"n": n, "sparse": False, "text": f"{share:.0%}", "heat": min(4, 1 + int(share * 4))}
                )
        rows.append({"tool": tool, "total": total, "cells": cells})
    return {"rows": rows, "outcomes": [(o, OUTCOME_LABEL[o]) for o in MATRIX_OUTCOMES]}


def fleet_overview(request: HttpRequest) -> dict[str, Any]:
    """The Fleet page's saga half (chart and outcome matrix); `frontend.fleet_views` renders the
    page with the gate's half (gauges, denials, kill switches, forms)."""
    now = timezone.now()
    window = request.GET.get("window", "24h")
    window = window if window in _SINCE else "24h"
    since = now - _SINCE[window]
    sagas = selectors.started_sagas_active_since(since, limit=2000)
    chart = None
    if sagas:
        # Zoom to the activity actually in the window, with a little air on the left.
        first = min(_active_span(s, now)[0] for s in sagas)
        start = max(since, first - (now - first) * 0.05)
        chart = _chart(sagas, start, now, now)
    return {
        "chart": chart,
        "matrix": _matrix(selectors.step_outcomes_by_tool(since)),
        "window": window,
        "windows": FLEET_WINDOWS,
        "saga_total": len(sagas),
        "sparse_below": SPARSE_BELOW,
        "statuses": SagaStatus.choices,
    }
