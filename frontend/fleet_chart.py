"""The Fleet page's saga half: sagas over time, one lane per agent stream (an SVG chart drawn on
the server: no script), and each tool's step outcomes as shares. `frontend.fleet_views` renders
the page with the gate's half (gauges, denials, kill switches, forms)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone

from frontend.saga_views import OUTCOME_LABEL, SINCE
from sagas import selectors
from sagas.models import SagaStatus, StepStatus
from sagas.selectors import StartedSaga

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
# A lane draws each saga as its own bar up to this many; past it, the lane is cut into SLOTS
# columns by start time, one bar each (what it holds in its title, its worst status its colour),
# so the page stays the same size however many sagas the window holds.
BARS_PER_LANE = 40
SLOTS = 60
# Worst first: the colour a slot takes from the sagas it holds.
SEVERITY = [
    SagaStatus.ROLLBACK_PARTIAL,
    SagaStatus.ORPHANED,
    SagaStatus.QUARANTINED,
    SagaStatus.RECOVERING,
    SagaStatus.ROLLED_BACK,
    SagaStatus.RUNNING,
    SagaStatus.COMPLETED,
]
CHART_WIDTH, LABEL_WIDTH, LANE_HEIGHT, TOP, BOTTOM = 960, 170, 30, 10, 34


def _active_span(saga: StartedSaga, now: datetime) -> tuple[datetime, datetime]:
    """When a saga began and when it was last active, as the chart draws it. The chart's sagas
    have both (the selector returns started sagas active in the window); one with neither would
    be drawn at `now`."""
    begin = saga.started_at or saga.last_activity_at or now
    return begin, saga.last_activity_at or begin


def _time_format(span: float) -> str:
    """How the chart writes a moment, for a window of `span` seconds."""
    return "%H:%M:%S" if span <= 3600 else ("%H:%M" if span <= 2 * 86400 else "%m-%d %H:%M")


def _bar(href: str, title: str, status: str, x0: float, x1: float) -> dict[str, Any]:
    return {
        "href": href,
        "title": title,
        "status": status,
        "x": x0,
        "w": max(x1 - x0, 3.0),
        "end": max(x1, x0 + 3.0),
        "rollback": status in (SagaStatus.ROLLED_BACK, SagaStatus.ROLLBACK_PARTIAL),
        "hatched": status in (SagaStatus.ROLLBACK_PARTIAL, SagaStatus.ORPHANED),
    }


def _bars(lane: list[StartedSaga], now: datetime, x: Callable[[datetime], float]) -> list[dict[str, Any]]:
    """One bar per saga, from its start to its last activity, linking to the saga."""
    labels = dict(SagaStatus.choices)
    out = []
    for saga in lane:
        begin, finish = _active_span(saga, now)
        status = saga.status
        title = f"{saga.name or saga.saga_id} — {labels.get(status, status)}"
        out.append(_bar(reverse("saga-detail", args=[saga.saga_id]), title, status, x(begin), x(finish)))
    return out


def _slots(
    stream: str,
    lane: list[StartedSaga],
    start: datetime,
    span: float,
    now: datetime,
    x: Callable[[datetime], float],
) -> list[dict[str, Any]]:
    """The lane's sagas counted per column of start time: one bar per column that holds any,
    linking to the saga list of the stream (and of the column's worst status)."""
    width = span / SLOTS
    counts: list[Counter[str]] = [Counter() for _ in range(SLOTS)]
    for saga in lane:
        begin, _ = _active_span(saga, now)
        slot = min(max(int((begin - start).total_seconds() / width), 0), SLOTS - 1)
        counts[slot][saga.status] += 1
    labels = dict(SagaStatus.choices)
    out = []
    for slot, count in enumerate(counts):
        if not count:
            continue
        worst = next((s for s in SEVERITY if count[s]), next(iter(count)))
        left = start + timedelta(seconds=slot * width)
        right = start + timedelta(seconds=(slot + 1) * width)
        held = ", ".join(f"{n} {labels.get(s, s).lower()}" for s, n in count.most_common())
        when = f"{left.strftime(_time_format(span))}–{right.strftime(_time_format(span))}"
        title = f"{sum(count.values())} sagas started {when}: {held}"
        href = reverse("sagas") + "?" + urlencode({"stream": stream, "status": worst})
        out.append(_bar(href, title, worst, x(left), x(right) - 1.0))
    return out


def _chart(sagas: list[StartedSaga], start: datetime, end: datetime, now: datetime) -> dict[str, Any]:
    lanes: dict[str, list[StartedSaga]] = defaultdict(list)
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
        lane = lanes[name]
        bars = _bars(lane, now, x) if len(lane) <= BARS_PER_LANE else _slots(name, lane, start, span, now, x)
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
        fmt = _time_format(span)
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
    window = window if window in SINCE else "24h"
    since = now - SINCE[window]
    sagas = selectors.started_sagas_active_since(since, limit=2000, now=now)
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
