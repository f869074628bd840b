"""The questions the transparency workers must ask across tenants: which tenants have work.

Each answers with tenant ids (and an export's id), nothing else; the caller then works on each
tenant inside `tenant_context`. On Postgres each is a SECURITY DEFINER function owned by the owner
role (tenants/rls.py), which the runtime role may call and cannot change; on SQLite the same
query runs through the ORM with its tenant filter lifted.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from audit.models import TenantLog
from tenants import rls
from tenants.scoping import dangerously_bypass_orm_scope
from transparency.models import Export, ExportStatus, SealState, TreeState

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
