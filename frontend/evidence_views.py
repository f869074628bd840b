"""Evidence (auditor/admin/owner): the log's latest signed checkpoint and verifier key, per-stream
chain status with refused (equivocating) batches, and WORM exports: start, watch, download.

Reads `audit` and `transparency` models; starting an export goes through
`transparency.services.request_export`. Downloads are the API's own endpoint (session auth)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from audit.models import Record, RefusedBatch, Stream, TenantLog
from frontend.views import actor_of, member_page, page
from transparency import proofs
from transparency import services as transparency
from transparency.models import Export, ExportStatus

EXPORTS_SHOWN = 20


def _streams() -> list[dict[str, Any]]:
    streams = list(Stream.objects.order_by("-updated_at")[:200])
    refused: dict[str, list[RefusedBatch]] = {}
    for attempt in RefusedBatch.objects.order_by("-received_at")[:500]:
        refused.setdefault(attempt.stream_id, []).append(attempt)
    rows = []
    for stream in streams:
        last = Record.objects.filter(stream=stream).order_by("-position").first()
        attempts = refused.get(stream.stream_id, [])
        rows.append({"stream": stream, "last": last, "refused": attempts[:5], "refused_count": len(attempts)})
    return rows


def _export_view(export: Export) -> dict[str, Any]:
    done = export.status in (ExportStatus.DONE, ExportStatus.FAILED)
    return {
        "export": export,
        "percent": round(export.progress * 100),
        "done": done,
        "status_url": reverse("export-status", args=[export.pk]),
        "download_url": reverse("audit-export-download", args=[export.pk])
        if export.status == ExportStatus.DONE
        else "",
    }


@member_page("audit", section="evidence")
def evidence(request: HttpRequest) -> HttpResponse:
    log = TenantLog.objects.first()
    checkpoint = proofs.latest_checkpoint()
    keys = transparency.current_verifier_keys()
    context: dict[str, Any] = {
        "log_size": log.size if log else 0,
        "checkpoint": checkpoint,
        "verifier_key": keys[0] if keys else "",
        "other_keys": keys[1:],
        "unsigned": (log.size if log else 0) - (checkpoint.size if checkpoint else 0),
        "streams": _streams(),
        "exports": [_export_view(e) for e in Export.objects.order_by("-created_at")[:EXPORTS_SHOWN]],
    }
    return page(request, "frontend/evidence.html", context, section="evidence")


@require_POST
@member_page("audit", section="evidence")
def start_export(request: HttpRequest) -> HttpResponse:
    if proofs.latest_checkpoint() is None:
        messages.error(request, "An export needs a signed checkpoint; none exists yet.")
        return redirect("evidence")
    export = transparency.request_export(request.tenant, actor=actor_of(request))
    messages.success(request, "Export started: it appears below and updates as it runs.")
    return redirect(reverse("evidence") + f"#export-{export.pk}")


@member_page("audit", section="evidence")
def export_status(request: HttpRequest, export_id: Any) -> HttpResponse:
    export = Export.objects.filter(pk=export_id).first()
    if export is None:
        raise Http404("no such export")
    return render(request, "frontend/_export_row.html", {"e": _export_view(export)})
