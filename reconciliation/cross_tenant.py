"""The one question the reconciliation pass asks across tenants: which tenants have work (new log
leaves past their watermark, or open checks that are due: to expire, or to offer to a webhook).
Ids only; the pass then works in each tenant with `tenant_context`. And /metrics' backlog: open
checks and log leaves the pass has not looked at yet, all tenants together (counts only).
SECURITY DEFINER functions on Postgres (core/rls.py), the same queries through the ORM with
their tenant filter lifted on SQLite."""

from __future__ import annotations

from datetime import datetime

from audit.models import TenantLog
from core import rls
from core.scoping import dangerously_bypass_orm_scope
from reconciliation.models import OPEN_STATUSES, ReconciliationCheck, ReconciliationCursor
from tenants.models import Tenant

_OPEN = ", ".join(repr(status.value) for status in OPEN_STATUSES)

_TENANTS_TO_RECONCILE = rls.cross_tenant_function(
    "sagaplane_tenants_to_reconcile",
    arguments="due_before timestamptz",
    returns="TABLE (tenant_id bigint)",
    body=(
        f"SELECT log.tenant_id FROM {TenantLog._meta.db_table} AS log "
        f"LEFT JOIN {ReconciliationCursor._meta.db_table} AS cur ON cur.tenant_id = log.tenant_id "
        "WHERE log.size > coalesce(cur.scanned, 0) "
        f"UNION SELECT tenant_id FROM {ReconciliationCheck._meta.db_table} "
        f"WHERE status IN ({_OPEN}) AND not_before <= due_before "
        "ORDER BY 1"
    ),
)


def tenants_to_reconcile(now: datetime) -> list[int]:
    if rls.enforces_rls():
        return [tenant_id for (tenant_id,) in _TENANTS_TO_RECONCILE.rows(now)]
    with dangerously_bypass_orm_scope():
        sizes = dict(TenantLog.objects.values_list("tenant_id", "size"))
        scanned = dict(ReconciliationCursor.objects.values_list("tenant_id", "scanned"))
        due = set(
            ReconciliationCheck.objects.filter(status__in=OPEN_STATUSES, not_before__lte=now).values_list(
                "tenant_id", flat=True
            )
        )
    grown = {tenant_id for tenant_id, size in sizes.items() if size > scanned.get(tenant_id, 0)}
    return sorted(grown | due)


# Open checks are counted tenant by tenant through the (tenant, status, not_before) index (decided
# checks accumulate; open ones do not); unscanned leaves are one row per tenant log.
_RECONCILIATION_BACKLOG = rls.cross_tenant_function(
    "sagaplane_reconciliation_backlog",
    arguments="",
    returns="TABLE (open_checks bigint, unscanned_leaves bigint)",
    body=(
        "SELECT (SELECT coalesce(sum(waiting.n), 0) "
        f"FROM {Tenant._meta.db_table} AS t CROSS JOIN LATERAL (SELECT count(*) AS n "
        f"FROM {ReconciliationCheck._meta.db_table} AS c "
        f"WHERE c.tenant_id = t.id AND c.status IN ({_OPEN})) AS waiting)::bigint, "
        "(SELECT coalesce(sum(greatest(log.size - coalesce(cur.scanned, 0), 0)), 0) "
        f"FROM {TenantLog._meta.db_table} AS log "
        f"LEFT JOIN {ReconciliationCursor._meta.db_table} AS cur ON cur.tenant_id = log.tenant_id)::bigint"
    ),
)


def queue_depths() -> dict[str, int]:
    """reconciliation_checks_open (checks waiting for an observer or being observed) and
    reconciliation_leaves_unscanned (log leaves the pass has not turned into checks yet)."""
    if rls.enforces_rls():
        ((open_checks, unscanned),) = _RECONCILIATION_BACKLOG.rows()
    else:
        with dangerously_bypass_orm_scope():
            open_checks = ReconciliationCheck.objects.filter(status__in=OPEN_STATUSES).count()
            sizes = dict(TenantLog.objects.values_list("tenant_id", "size"))
            scanned = dict(ReconciliationCursor.objects.values_list("tenant_id", "scanned"))
        unscanned = sum(max(size - scanned.get(tenant_id, 0), 0) for tenant_id, size in sizes.items())
    return {
        "reconciliation_checks_open": int(open_checks),
        "reconciliation_leaves_unscanned": int(unscanned),
    }
