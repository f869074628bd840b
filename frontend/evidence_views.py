"""Evidence (auditor/admin/owner): the log's latest signed checkpoint and verifier key, per-stream
chain status with refused (equivocating) batches, and WORM exports: start, watch, download.

Reads through `audit.selectors` and `transparency.selectors`; starting an export goes through
`transparency.services.request_export`. Downloads are the API's own endpoint (session auth)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from audit import selectors as audit_selectors
from frontend.views import MemberRequest, actor_of, member_page, page
from sagas import selectors as saga_selectors
from tenants.access import AUDIT, WITNESSES_CHANGE
from transparency import selectors as log_selectors
from transparency import services as transparency
from transparency import witnesses
from transparency.models import Export, ExportStatus

EXPORTS_SHOWN = 20
REFUSALS_SHOWN = 20


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


def _agents_by_stream() -> dict[str, str]:
    """The names agents give themselves, by stream (from their recent sagas), beside the ids."""
    names: dict[str, list[str]] = {}
    for stream_id, agent in saga_selectors.recent_stream_agents():
        names.setdefault(stream_id, []).append(agent)
    return {stream_id: ", ".join(agents) for stream_id, agents in names.items()}


@member_page({"GET": AUDIT}, section="evidence")
def evidence(request: MemberRequest) -> HttpResponse:
    log_size = audit_selectors.log_size()
    streams = audit_selectors.stream_statuses(streams=200, refusals=500, refusals_each=5)
    agents = _agents_by_stream()
    checkpoint = log_selectors.latest_checkpoint()
    keys = log_selectors.verifier_keys()
    context: dict[str, Any] = {
        "log_size": log_size,
        "checkpoint": checkpoint,
        "verifier_key": keys[0] if keys else "",
        "other_keys": keys[1:],
        "unsigned": log_size - (checkpoint.size if checkpoint else 0),
        "streams": [(row, agents.get(row.stream.stream_id, "")) for row in streams],
        "exports": [_export_view(e) for e in log_selectors.recent_exports(EXPORTS_SHOWN)],
        "witnesses": witnesses.witnesses(),
        "quorum": witnesses.quorum(),
        "refusals": witnesses.recent_refusals(REFUSALS_SHOWN),
        "manage_witnesses": request.membership.can(WITNESSES_CHANGE.capability or ""),
    }
    return page(request, "frontend/evidence.html", context, section="evidence")


@member_page({"POST": AUDIT}, section="evidence")
def start_export(request: MemberRequest) -> HttpResponse:
    if log_selectors.latest_checkpoint() is None:
        messages.error(request, "An export needs a signed checkpoint; none exists yet.")
        return redirect("evidence")
    export = transparency.request_export(request.tenant, actor=actor_of(request))
    messages.success(request, "Export started: it appears below and updates as it runs.")
    return redirect(reverse("evidence") + f"#export-{export.pk}")


@member_page({"GET": AUDIT}, section="evidence")
def export_status(request: MemberRequest, export_id: Any) -> HttpResponse:
    export = log_selectors.export(export_id)
    if export is None:
        raise Http404("no such export")
    return render(request, "frontend/_export_row.html", {"e": _export_view(export)})
