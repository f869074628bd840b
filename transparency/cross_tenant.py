"""The questions the transparency workers must ask across tenants: which tenants have work.

Each answers with tenant ids (and an export's id), nothing else; the caller then works on each
tenant inside `tenant_context`. On Postgres each is a SECURITY DEFINER function owned by the owner
role (core/rls.py), which the runtime role may call and cannot change; on SQLite the same
query runs through the ORM with its tenant filter lifted.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.utils import timezone

from audit.models import TenantLog
from core import rls
from core.scoping import dangerously_bypass_orm_scope
from transparency.models import (
    Checkpoint,
    Export,
    ExportStatus,
    SealState,
    TreeState,
    Witness,
    WitnessRefusal,
)

_UNFINISHED = (ExportStatus.QUEUED.value, ExportStatus.RUNNING.value)

_TENANTS_TO_INTEGRATE = rls.cross_tenant_function(
    "sagaplane_tenants_to_integrate",
    arguments="",
    returns="TABLE (tenant_id bigint)",
    body=(
        f"SELECT log.tenant_id FROM {TenantLog._meta.db_table} AS log "
        f"LEFT JOIN {TreeState._meta.db_table} AS tree ON tree.tenant_id = log.tenant_id "
        "WHERE log.size > coalesce(tree.size, -1) ORDER BY log.tenant_id"
    ),
)
_TENANTS_TO_SEAL = rls.cross_tenant_function(
    "sagaplane_tenants_to_seal",
    arguments="",
    returns="TABLE (tenant_id bigint)",
    body=(
        f"SELECT log.tenant_id FROM {TenantLog._meta.db_table} AS log "
        f"LEFT JOIN {SealState._meta.db_table} AS seal ON seal.tenant_id = log.tenant_id "
        "WHERE log.size > coalesce(seal.sealed_size, 0) ORDER BY log.tenant_id"
    ),
)
_STALE_EXPORTS = rls.cross_tenant_function(
    "sagaplane_stale_exports",
    arguments="quiet_since timestamptz",
    returns="TABLE (tenant_id bigint, export_id uuid)",
    body=(
        f"SELECT tenant_id, id FROM {Export._meta.db_table} "
        f"WHERE status IN ({', '.join(repr(status) for status in _UNFINISHED)}) "
        "AND heartbeat_at < quiet_since"
    ),
)

_CP, _W = Checkpoint._meta.db_table, Witness._meta.db_table
_TENANTS_TO_COSIGN = rls.cross_tenant_function(
    "sagaplane_tenants_to_cosign",
    arguments="",
    returns="TABLE (tenant_id bigint)",
    body=(
        f"SELECT DISTINCT w.tenant_id FROM {_W} AS w WHERE w.next_attempt_at <= now() "
        f"AND coalesce(w.cosigned_checkpoint_id, 0) < "
        f"(SELECT max(c.id) FROM {_CP} AS c WHERE c.tenant_id = w.tenant_id) ORDER BY w.tenant_id"
    ),
)
_WITNESS_LAG = rls.cross_tenant_function(
    "sagaplane_witness_lag_seconds",
    arguments="",
    returns="TABLE (lag double precision)",
    body=(
        "SELECT coalesce(max(extract(epoch FROM now() - ("
        f"SELECT c.created_at FROM {_CP} AS c WHERE c.tenant_id = w.tenant_id "
        "AND c.id > coalesce(w.cosigned_checkpoint_id, 0) ORDER BY c.id LIMIT 1))), 0)::double precision "
        f"FROM {_W} AS w"
    ),
)
_WITNESS_REFUSALS = rls.cross_tenant_function(
    "sagaplane_witness_refusals",
    arguments="",
    returns="TABLE (status integer, refusals bigint)",
    body=f"SELECT status::integer, count(*) FROM {WitnessRefusal._meta.db_table} GROUP BY status",
)


def tenants_to_cosign() -> list[int]:
    """Ids of tenants with a witness that is due and has not cosigned the latest checkpoint."""
    if rls.enforces_rls():
        return [tenant_id for (tenant_id,) in _TENANTS_TO_COSIGN.rows()]
    with dangerously_bypass_orm_scope():
        latest: dict[int, int] = {}
        for tenant_id, checkpoint_id in Checkpoint.objects.values_list("tenant_id", "id"):
            latest[tenant_id] = max(latest.get(tenant_id, 0), checkpoint_id)
        due = Witness.objects.filter(next_attempt_at__lte=timezone.now())
        return sorted(
            {w.tenant_id for w in due if (w.cosigned_checkpoint_id or 0) < latest.get(w.tenant_id, 0)}
        )


def witness_lag_seconds() -> float:
    """Across tenants, the age of the oldest checkpoint some witness has not cosigned yet (0: none)."""
    if rls.enforces_rls():
        return float(_WITNESS_LAG.rows()[0][0])
    now, lag = timezone.now(), 0.0
    with dangerously_bypass_orm_scope():
        for w in Witness.objects.all():
            first = (
                Checkpoint.objects.filter(tenant_id=w.tenant_id, id__gt=w.cosigned_checkpoint_id or 0)
                .order_by("id")
                .values_list("created_at", flat=True)
                .first()
            )
            if first is not None:
                lag = max(lag, (now - first).total_seconds())
    return lag


def witness_refusals() -> dict[int, int]:
    """Refusals kept, all tenants together, by the witness's status (0: unreachable)."""
    if rls.enforces_rls():
        return {int(status): int(count) for status, count in _WITNESS_REFUSALS.rows()}
    with dangerously_bypass_orm_scope():
        out: dict[int, int] = {}
        for status in WitnessRefusal.objects.values_list("status", flat=True):
            out[status] = out.get(status, 0) + 1
        return out


def tenants_to_integrate() -> list[int]:
    """Ids of tenants whose log has leaves not yet in a signed checkpoint (or no tree yet)."""
    if rls.enforces_rls():
        return [tenant_id for (tenant_id,) in _TENANTS_TO_INTEGRATE.rows()]
    with dangerously_bypass_orm_scope():
        sizes = dict(TenantLog.objects.values_list("tenant_id", "size"))
        integrated = dict(TreeState.objects.values_list("tenant_id", "size"))
    return sorted(tenant_id for tenant_id, size in sizes.items() if size > integrated.get(tenant_id, -1))


def tenants_to_seal() -> list[int]:
    """Ids of tenants with accepted leaves the seal pass has not looked at yet."""
    if rls.enforces_rls():
        return [tenant_id for (tenant_id,) in _TENANTS_TO_SEAL.rows()]
    with dangerously_bypass_orm_scope():
        sizes = dict(TenantLog.objects.values_list("tenant_id", "size"))
        sealed = dict(SealState.objects.values_list("tenant_id", "sealed_size"))
    return sorted(tenant_id for tenant_id, size in sizes.items() if size > sealed.get(tenant_id, 0))


def stale_exports(quiet_since: datetime) -> list[tuple[int, uuid.UUID]]:
    """(tenant id, export id) of unfinished exports with no sign of life since `quiet_since`
    (on the (status, heartbeat_at) index)."""
    if rls.enforces_rls():
        return [(tenant_id, export_id) for tenant_id, export_id in _STALE_EXPORTS.rows(quiet_since)]
    with dangerously_bypass_orm_scope():
        return list(
            Export.objects.filter(status__in=_UNFINISHED, heartbeat_at__lt=quiet_since).values_list(
                "tenant_id", "pk"
            )
        )
