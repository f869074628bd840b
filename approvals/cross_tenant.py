"""The one question /metrics asks approvals across tenants: how many requests wait for a decision
(sagaplane_queue_depth{queue="approvals_pending"}). A count only, never a row or a tenant id. On
Postgres a SECURITY DEFINER function owned by the owner role (core/rls.py) that counts tenant
by tenant through the (tenant, status, expires_at) index, so the cost follows the number of
tenants and pending requests, not the history of decided ones; on SQLite the same through the
ORM with its tenant filter lifted."""

from __future__ import annotations

from approvals.models import ApprovalRequest, Status
from core import rls
from core.scoping import dangerously_bypass_orm_scope
from tenants.models import Tenant

_PENDING_APPROVALS = rls.cross_tenant_function(
    "sagaplane_pending_approvals_count",
    arguments="",
    returns="bigint",
    body=(
        f"SELECT coalesce(sum(waiting.n), 0)::bigint FROM {Tenant._meta.db_table} AS t "
        f"CROSS JOIN LATERAL (SELECT count(*) AS n FROM {ApprovalRequest._meta.db_table} AS r "
        f"WHERE r.tenant_id = t.id AND r.status = '{Status.PENDING.value}') AS waiting"
    ),
)


def queue_depths() -> dict[str, int]:
    """Approval requests waiting for a decision, all tenants together."""
    if rls.enforces_rls():
        ((pending,),) = _PENDING_APPROVALS.rows()
        return {"approvals_pending": int(pending)}
    with dangerously_bypass_orm_scope():
        return {"approvals_pending": ApprovalRequest.objects.filter(status=Status.PENDING).count()}
