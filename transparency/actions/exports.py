"""WORM exports: requested (recorded in the server stream), claimed by a build attempt as leased
work (`core.claims`: the attempt number is the fencing token, the heartbeat the sign of life),
built in short transactions with visible progress, published write-once, and swept when a build
goes quiet (re-queued, or failed after SAGAPLANE_EXPORT_MAX_ATTEMPTS)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from sagaplane.events import Event

from core.actionaudit import append_server_record
from core.actors import Actor, stored
from core.claims import Leased, claim
from core.postcommit import after_commit
from core.scoping import require_tenant
from tenants.models import Tenant
from transparency import cross_tenant, witnesses
from transparency.actions.common import IntegrationRefused
from transparency.models import Checkpoint, Export, ExportStatus

log = logging.getLogger(__name__)

# A build holds its export while it is running with its attempt number; the sweep (not a lapsed
# lease) hands a quiet one back by queueing it again, so only a queued export is claimable.
BUILDS: Leased[Export] = Leased(
    Export,
    state="status",
    claimed=ExportStatus.RUNNING,
    claimable=(ExportStatus.QUEUED,),
    token="attempts",
    holder=None,
    lease="heartbeat_at",
)


def request_export(
    tenant: Tenant,
    *,
    actor: Actor,
    first: int | None = None,
    end: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Export:
    """A queued export, recorded in the server stream; the task `transparency.tasks.build_export`
    fills it in."""
    require_tenant(tenant)
    with transaction.atomic():
        export = Export.objects.create(
            tenant=tenant, first=first, end=end, since=since, until=until, requested_by=stored(actor)
        )
        append_server_record(
            tenant,
            Event.AUDIT_EXPORT_REQUESTED,
            {
                "export": str(export.pk),
                "old": None,
                "new": {"status": export.status, "first": first, "end": end, "since": since, "until": until},
            },
            actor=actor,
        )
        # Best effort: with the broker down the request still answers 202 (its commit stands) and
        # the stale sweep sends the message later.
        after_commit(f"queue export {export.pk}", lambda: _enqueue_export(export))
        return export


def record_export_download(tenant: Tenant, export: Export, *, actor: Actor) -> None:
    """Who was handed which export (its range, checkpoint and digest), in the server stream. A
    download changes no state, so the record names what was disclosed instead of old and new
    values; the caller serves the file only after this is written in its transaction."""
    require_tenant(tenant)
    append_server_record(
        tenant,
        Event.AUDIT_EXPORT_DOWNLOADED,
        {
            "export": str(export.pk),
            "first": export.first,
            "end": export.end,
            "checkpoint_size": export.checkpoint.size if export.checkpoint is not None else None,
            "sha256": export.sha256,
        },
        actor=actor,
    )


def _enqueue_export(export: Export) -> None:
    from transparency.tasks import build_export

    build_export.delay(str(export.pk), export.tenant_id)


def _export_stale_after() -> timedelta:
    return timedelta(minutes=getattr(settings, "SAGAPLANE_EXPORT_STALE_MINUTES", 10))


def _export_max_attempts() -> int:
    return max(1, int(getattr(settings, "SAGAPLANE_EXPORT_MAX_ATTEMPTS", 3)))


def record_export_progress(tenant: Tenant, export_id: Any, attempt: int, done: int, total: int) -> None:
    """Progress is its own short transaction so pollers (and the stale sweep) see it while the
    build runs. Fenced on `attempt`: a build the sweep has replaced writes nothing."""
    require_tenant(tenant)
    BUILDS.held(Export.objects.filter(pk=export_id), attempt).update(
        records_done=done, records_total=total, heartbeat_at=timezone.now()
    )


def finish_export(tenant: Tenant, export_id: Any, attempt: int, **fields: Any) -> bool:
    """Record the end of build `attempt`; False (and nothing written) if it no longer owns the
    export, i.e. the sweep re-queued or failed it meanwhile."""
    require_tenant(tenant)
    return bool(
        BUILDS.held(Export.objects.filter(pk=export_id), attempt).update(
            finished_at=timezone.now(), heartbeat_at=timezone.now(), **fields
        )
    )


@dataclass(frozen=True)
class ExportClaim:
    """What a build attempt holds: the export, the terms every attempt builds, its attempt number."""

    export: Export
    checkpoint: Checkpoint
    previous: Export | None
    first: int
    end: int
    attempt: int


def claim_export(tenant: Tenant, export_id: Any) -> ExportClaim | None:
    """Mark a queued export running as the next attempt (`BUILDS`: one conditional UPDATE raising
    the attempt number, so a duplicate or redelivered message finds nothing to claim). The first
    claim fixes the range, checkpoint and predecessor; a retry reuses them, so every attempt builds
    the same bundle."""
    require_tenant(tenant)
    # Lock only the export row (Postgres refuses FOR UPDATE across the nullable joins).
    export = (
        Export.objects.select_for_update(of=("self",))
        .select_related("checkpoint", "previous")
        .get(pk=export_id)
    )
    if export.status != ExportStatus.QUEUED:
        return None
    checkpoint, previous, first, end = _bundle_terms(tenant, export)
    now = timezone.now()
    taken = claim(
        BUILDS,
        lambda _now: Export.objects.filter(pk=export.pk).order_by("pk"),
        now=now,
        holder="",
        lease_until=now,
        limit=1,
        shape=("export", tenant.pk, export.pk),
        also={
            "first": first,
            "end": end,
            "checkpoint": checkpoint.pk,
            "previous": previous.pk if previous is not None else None,
            "records_done": 0,
            "records_total": end - first,
        },
    )
    if not taken:
        return None
    return ExportClaim(export, checkpoint, previous, first, end, taken[0].attempts)


def _bundle_terms(tenant: Tenant, export: Export) -> tuple[Checkpoint, Export | None, int, int]:
    """The checkpoint, predecessor and leaf range every attempt of `export` builds: fixed by its
    first claim, reused by a retry."""
    from transparency.bundles import resolve_range

    if export.checkpoint is not None and export.first is not None and export.end is not None:
        return export.checkpoint, export.previous, export.first, export.end
    # The newest the quorum of witnesses cosigned, so the export verifies under the policy.
    latest = witnesses.proving_checkpoint(0)
    if latest is None:
        raise IntegrationRefused("integration_refused", "the log has no signed checkpoint yet", status=500)
    previous = (
        Export.objects.filter(status=ExportStatus.DONE).exclude(pk=export.pk).order_by("-finished_at").first()
    )
    first, end = resolve_range(tenant, export, latest)
    return latest, previous, first, end


def fail_unclaimed_export(tenant: Tenant, export_id: Any, reason: str) -> None:
    """A queued export whose build refused before claiming it (no checkpoint yet, a range outside
    the log): failed now, since a retry would only refuse again."""
    require_tenant(tenant)
    Export.objects.filter(pk=export_id, status=ExportStatus.QUEUED).update(
        status=ExportStatus.FAILED, error=reason[:2000], finished_at=timezone.now()
    )


def export_storage_name(tenant: Tenant, export_id: Any) -> str:
    return f"tenant-{tenant.pk}/{export_id}.tar.gz"


def stale_exports(now: datetime | None = None) -> list[tuple[int, Any]]:
    """(tenant id, export id) of unfinished exports with no sign of life within the stale window
    (cross-tenant: the sweep's one query, on the (status, heartbeat_at) index)."""
    return cross_tenant.stale_exports((now or timezone.now()) - _export_stale_after())


def requeue_or_fail_export(tenant: Tenant, export_id: Any, now: datetime | None = None) -> str | None:
    """One stale export, one transaction: "failed" once its builds have died
    SAGAPLANE_EXPORT_MAX_ATTEMPTS times, else "requeued" (queued again, a new message sent after
    commit); None if it showed progress or finished since the sweep's query."""
    now = now or timezone.now()
    cutoff = now - _export_stale_after()
    require_tenant(tenant)
    export = Export.objects.select_for_update().filter(pk=export_id).first()
    if (
        export is None
        or export.status not in (ExportStatus.QUEUED, ExportStatus.RUNNING)
        or export.heartbeat_at >= cutoff
    ):
        return None
    if export.status == ExportStatus.RUNNING and export.attempts >= _export_max_attempts():
        Export.objects.filter(pk=export.pk).update(
            status=ExportStatus.FAILED,
            finished_at=now,
            heartbeat_at=now,
            error=(
                f"gave up after {export.attempts} attempt(s): each build stopped making progress "
                f"for {_export_stale_after()} (worker lost?)"
            ),
        )
        return "failed"
    # A running build that went quiet is presumed dead (its late writes are fenced off by the
    # attempt number); a queued one lost its message. Either way: queue it again. The attempt
    # is counted when a worker claims it, so a lost message costs no attempt.
    Export.objects.filter(pk=export.pk).update(status=ExportStatus.QUEUED, heartbeat_at=now)
    after_commit(f"re-queue export {export.pk}", lambda: _enqueue_export(export))
    return "requeued"
