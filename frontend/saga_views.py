"""Sagas (list, detail with timeline and record inspector) and the fleet overview's saga half.

Reads only, through selectors: the saga projection (`sagas.selectors`), the stored records in WAL
form (`audit.selectors`), credentials masked by `sagas.services.mask_credentials`.
Each page has a fragment URL that app.js fetches again when a `saga.event` arrives."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.db.models import Exists, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import Resolver404, resolve, reverse
from django.utils import timezone
from sagaplane.events import STEP_BACKWARD, STEP_FORWARD, Event

from audit import selectors as audit_selectors
from audit.models import Record
from fleet import selectors as fleet_selectors
from frontend import recovery_views, saga_story
from frontend.views import MemberRequest, member_page, page
from recovery import selectors as recovery_selectors
from sagas import selectors
from sagas.models import Saga, SagaStatus, Step, StepStatus
from sagas.services import STEP_EVENTS, mask_credentials
from tenants.access import READ

SINCE_CHOICES = [
    ("", "Any time"),
    ("1h", "Last hour"),
    ("24h", "Last 24 hours"),
    ("7d", "Last 7 days"),
    ("30d", "Last 30 days"),
]
SINCE = {
    "1h": timedelta(hours=1),
    "24h": timedelta(days=1),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
PAGE_SIZE = 50
# The status tabs count up to COUNT_CAP sagas each ("1,000+" past it); "needs a human" counts its
# few sagas exactly up to NEEDS_HUMAN_CAP. Both bound the page's work whatever the tenant's size.
COUNT_CAP = 1_000
NEEDS_HUMAN_CAP = 10_000


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
            since=since if since in SINCE else "",
        )

    def query(self, **override: str) -> str:
        """The filters as a query string (empty ones left out), with `override` applied; a
        `cursor=` (older) or `before=` (newer) override adds a place in the list."""
        values = {**self.__dict__, **override}
        return urlencode({k: v for k, v in values.items() if v})


def _since(filters: Filters, now: datetime) -> QuerySet[Saga]:
    """The sagas active in the filter's window: a bound of every index range the page reads."""
    sagas = selectors.all_sagas()
    if filters.since:
        sagas = sagas.filter(last_activity_at__gte=now - SINCE[filters.since])
    return sagas


def _probe(filters: Filters) -> Q | Exists | None:
    """The tool and stream filters as one test of a saga, for the counts: probed saga by saga
    along a bounded walk of each status (neither has an index the counts could range over)."""
    probes: list[Q | Exists] = []
    if filters.tool:
        probes.append(selectors.uses_tool(filters.tool))
    if filters.stream:
        probes.append(Q(stream_id=filters.stream))
    if not probes:
        return None
    return probes[0] if len(probes) == 1 else Q(probes[0]) & Q(probes[1])


@dataclass(frozen=True)
class SagaRow:
    """A saga as its list row shows it: the saga, its effective status now, whether it needs a
    human, how many steps it has."""

    saga: Saga
    shown_status: str
    needs_human: bool
    step_count: int

    @classmethod
    def of(cls, saga: Saga, now: datetime, step_count: int, needing: set[str]) -> SagaRow:
        return cls(saga, saga.effective_status(now), saga.saga_id in needing, step_count)


def _shown(count: selectors.BoundedCount) -> str:
    """ "1,000+" for a count that stopped at its bound, "12" for an exact one."""
    return f"{count.n:,}+" if count.more else f"{count.n:,}"


def _place(request: HttpRequest) -> tuple[tuple[datetime | None, int] | None, bool]:
    """Where in the list the reader is: (the keyset of a `cursor` (Older) or `before` (Newer)
    link, whether it is `before`), or (None, False) for the first page. A cursor the page did not
    write (or the old `page=` numbers) is the first page, never an error."""
    for name, newer in (("cursor", False), ("before", True)):
        if value := request.GET.get(name, ""):
            try:
                return selectors.cursor_position(value), newer
            except selectors.BadCursor:
                return None, False
    return None, False


def _page(sagas: QuerySet[Saga], request: HttpRequest, tool: str) -> tuple[list[Saga], bool, bool]:
    """The page of `sagas` the request is at, newest first: (sagas, whether a newer page exists,
    whether an older one does). One more than a page is read to know whether there is another;
    a Newer link that reaches the top with less than a page is the first page instead, and so is
    an Older link past the end."""
    position, newer = _place(request)
    if newer and position is not None:
        rows = selectors.newest_page(sagas, tool=tool, position=position, limit=PAGE_SIZE + 1, newer=True)
        if len(rows) > PAGE_SIZE:
            return rows[1:], True, True
        position = None
    rows = selectors.newest_page(sagas, tool=tool, position=position, limit=PAGE_SIZE + 1)
    if not rows and position is not None:  # past the oldest (the sagas there are gone): the top
        rows = selectors.newest_page(sagas, tool=tool, position=None, limit=PAGE_SIZE + 1)
        position = None
    return rows[:PAGE_SIZE], position is not None, len(rows) > PAGE_SIZE


def _list_context(request: HttpRequest) -> dict[str, Any]:
    now = timezone.now()
    filters = Filters.from_request(request)
    base = _since(filters, now)
    counts = selectors.bounded_status_counts(base, now, cap=COUNT_CAP, hit=_probe(filters))
    matching = selectors.with_effective_status(base, filters.status, now)
    if filters.stream:
        matching = matching.filter(stream_id=filters.stream)
    shown, newer, older = _page(matching, request, filters.tool)
    steps = selectors.step_counts(shown)
    needing = recovery_selectors.needing_human(shown)
    rows = [SagaRow.of(saga, now, steps.get(saga.pk, 0), needing) for saga in shown]
    # "Needs a human" is over every saga whatever the filters, exact up to its own (larger) cap,
    # and is the Recovery page's own count (recovery.selectors: one answer for both pages).
    needs_human = recovery_selectors.needs_human_count(NEEDS_HUMAN_CAP)
    total = sum(counts.values(), selectors.BoundedCount(0)).capped(COUNT_CAP)
    links = {
        "first": "?" + filters.query() if newer else "",
        "previous": "?" + filters.query(before=selectors.cursor_of(shown[0])) if newer else "",
        "next": "?" + filters.query(cursor=selectors.cursor_of(shown[-1])) if older else "",
    }
    # The place is part of the address like the filters, so a refresh (and the live fragment)
    # stays where the reader is; the first page is left out of the URL.
    here = filters.query(**_here(request)) if newer else filters.query()
    return {
        "filters": filters,
        "sagas": rows,
        "page_links": links,
        "paged": bool(links["previous"] or links["next"]),
        "status_counts": [
            {"value": value, "label": label, "n": _shown(counts[value]), "query": filters.query(status=value)}
            for value, label in SagaStatus.choices
        ],
        "total": _shown(total),
        "any_sagas": bool(rows) or selectors.all_sagas().exists(),
        "needs_human": needs_human.n,
        "needs_human_shown": _shown(needs_human),
        "fragment_url": reverse("saga-rows") + ("?" + here if here else ""),
    }


def _here(request: HttpRequest) -> dict[str, str]:
    """The `cursor` or `before` of the request (the one `_place` read)."""
    for name in ("cursor", "before"):
        if value := request.GET.get(name, ""):
            return {name: value}
    return {}


def _stream_choices() -> list[tuple[str, str]]:
    """(stream id, label) for the filter: the agent's name beside its stream id when one of the
    recently active sagas gave one."""
    agents = dict(selectors.recent_stream_agents())
    return [
        (stream_id, f"{agents[stream_id]} · {stream_id}" if agents.get(stream_id) else stream_id)
        for stream_id in audit_selectors.agent_stream_ids(limit=200)
    ]


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

# A step's records in two kinds (sagaplane.events): its forward outcome, and what undoing it came
# to; each with the status the projection gives it (sagas.services.STEP_EVENTS), not a copy.
FORWARD_OUTCOME: dict[str, StepStatus] = {event: STEP_EVENTS[event] for event in STEP_FORWARD}
BACKWARD_OUTCOME: dict[str, StepStatus] = {event: STEP_EVENTS[event] for event in STEP_BACKWARD}
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
    fallback: str = ""  # a STEP_ATTEMPT's fallback call: the tool it names
    fields: dict[str, Any] = field(default_factory=dict)  # the body, masked (frontend.saga_story)
    tool: str = ""


@dataclass
class StepView:
    step: Step
    outcome: str
    records: list[RecordView] = field(default_factory=list)
    recovery_job: Any = None  # the step's latest recovery job (frontend.recovery_views)
    rollback_here: bool = False  # offer "Rollback to here" on this step
    rollback_warning: str = ""  # the IRREVERSIBLE steps that rollback would meet
    attempts: int = 0  # its failed attempts that another call followed (STEP_ATTEMPT records)
    fallback: str = ""  # the tool its last STEP_ATTEMPT fell back to
    # Set by frontend.saga_story: when it started, how long it took, its approvals, a refusal.
    started: datetime | None = None
    duration: str = ""
    approvals: list[dict[str, Any]] = field(default_factory=list)
    denied: str = ""

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
    view.fields = dict(masked)
    view.tool = masked["tool"][:200] if isinstance(masked.get("tool"), str) else ""
    semantics = masked.pop("semantics", "")
    view.semantics = semantics if isinstance(semantics, str) else _pretty(semantics)
    if "kwargs" in masked:
        view.arguments = _pretty(masked.pop("kwargs"))
    if "compensation" in masked:
        view.compensation = _pretty(masked.pop("compensation"))
    fallback = masked.get("fallback")
    if (
        view.event == Event.STEP_ATTEMPT
        and isinstance(fallback, dict)
        and isinstance(fallback.get("tool"), str)
    ):
        view.fallback = fallback["tool"][:200]
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
        if view.event in FORWARD_OUTCOME and view.step_id in forward:
            item = forward[view.step_id]
            item.records.append(view)
            item.outcome = FORWARD_OUTCOME[view.event]
        elif view.event == Event.STEP_ATTEMPT and view.step_id in forward:
            # A retried (or fallen back) attempt of the step: shown with it, no outcome of its own.
            item = forward[view.step_id]
            item.records.append(view)
            item.attempts += 1
            item.fallback = view.fallback or item.fallback
        elif view.event in BACKWARD_OUTCOME:
            backward.append(
                CompensationView(
                    step=step_by_id.get(view.step_id), record=view, outcome=BACKWARD_OUTCOME[view.event]
                )
            )
            if view.step_id in forward:
                forward[view.step_id].records.append(view)
        else:
            saga_events.append(view)
            if view.event == Event.ROLLBACK_START:
                rollback_start = view
            elif view.event == Event.ROLLBACK_END:
                rollback_end = view
            elif view.event == Event.SAGA_ABORT_CAUSE:
                abort_cause = view
    shown_status = saga.effective_status(now)
    orphaned = recovery_selectors.orphaned(saga, now)
    disclosure = f"/api/v1/audit/sagas/{saga.saga_id}/disclosure"
    sealed = any(view.event == Event.SAGA_SEALED for view in saga_events)
    forward_items = [forward[s.step_id] for s in steps]
    membership = getattr(request, "membership", None)
    recovery = recovery_views.saga_recovery(membership, saga, forward_items) if membership is not None else {}
    context: dict[str, Any] = {
        **recovery,
        "saga": saga,
        "shown_status": shown_status,
        "needs_human": bool(recovery_selectors.needing_human([saga])),
        "quarantine": fleet_selectors.quarantine_of(saga.saga_id),
        "orphaned": orphaned,
        # When the page is to be fetched again although no record arrives: at the lease's expiry
        # (time passing is not a record), and while recovery is only starting, until it started.
        "stale_at": _stale_at(saga, shown_status, orphaned, now),
        "forward": forward_items,
        "backward": backward,
        "saga_events": saga_events,
        "rollback_start": rollback_start,
        "rollback_end": rollback_end,
        "abort_cause": abort_cause,
        "records": views,
        "running": shown_status == SagaStatus.RUNNING,
        # Offered once the saga is sealed: before that the API can only answer 409 `not_sealed`.
        "disclosure_url": disclosure if sealed and _url_exists(disclosure) else "",
        "fragment_url": reverse("saga-timeline", args=[saga.saga_id]),
        "outcomes": StepStatus.choices,
    }
    return saga_story.enrich(context)


def _stale_at(
    saga: Saga, status: str, orphaned: recovery_selectors.Orphaned | None, now: datetime
) -> datetime | None:
    if status == SagaStatus.RUNNING and saga.lease_expires_at is not None:
        return saga.lease_expires_at
    if orphaned is not None and orphaned.phase == "starting":
        return now + timedelta(seconds=2)
    return None


@member_page({"GET": READ}, section="sagas")
def saga_detail(request: MemberRequest, saga_id: str) -> HttpResponse:
    context = _detail_context(request, saga_id)
    return page(request, "frontend/saga_detail.html", context, section="sagas")


@member_page({"GET": READ}, section="sagas")
def saga_timeline(request: MemberRequest, saga_id: str) -> HttpResponse:
    context = {**_detail_context(request, saga_id), "caps": _caps(request)}
    return render(request, "frontend/_saga_timeline.html", context)
