"""Evidence (auditor/admin/owner): the log's latest signed checkpoint, per-stream chain status,
refused batches, WORM exports. Reads `audit` models; exports and checkpoints come from the
transparency app when it is installed."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.http import HttpRequest, HttpResponse

from audit.models import EquivocationAttempt, Record, Stream, TenantLog
from frontend.views import member_page, page


def _streams() -> list[dict[str, Any]]:
    streams = list(Stream.objects.order_by("-updated_at")[:200])
    refused: dict[str, list[EquivocationAttempt]] = {}
    for attempt in EquivocationAttempt.objects.order_by("-received_at")[:500]:
        refused.setdefault(attempt.stream_id, []).append(attempt)
    rows = []
    for stream in streams:
        last = Record.objects.filter(stream=stream).order_by("-position").first()
        rows.append(
            {
                "stream": stream,
                "last": last,
                "refused": refused.get(stream.stream_id, [])[:5],
                "refused_count": len(refused.get(stream.stream_id, [])),
            }
        )
    return rows


@member_page("audit", section="evidence")
def evidence(request: HttpRequest) -> HttpResponse:
    log = TenantLog.objects.first()
    context: dict[str, Any] = {
        "log_size": log.size if log else 0,
        "streams": _streams(),
        "transparency": apps.is_installed("transparency"),
    }
    return page(request, "frontend/evidence.html", context, section="evidence")
