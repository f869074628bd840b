"""The lease settlement's one question across tenants: which tenants have a budget lease its holder
never returned that is due to be settled (`fleet.actions.lease_settlement`). Tenant ids only; the
walker (`fleet.tasks.settle_expired_leases`) then enters each tenant with `tenant_context`. On
Postgres a SECURITY DEFINER function owned by the owner role (core/rls.py); on SQLite the same
through the ORM."""

from __future__ import annotations

from datetime import datetime

from core import rls
from core.scoping import dangerously_bypass_orm_scope
from fleet.models import GateLease, LeaseState

_TENANTS_WITH_LEASES_DUE = rls.cross_tenant_function(
    "sagaplane_tenants_with_leases_to_settle",
    arguments="due_at timestamptz",
    returns="TABLE (tenant_id bigint)",
    body=(
        f"SELECT DISTINCT tenant_id FROM {GateLease._meta.db_table} "
        f"WHERE state = '{LeaseState.OUTSTANDING.value}' AND settle_after <= due_at ORDER BY tenant_id"
    ),
)


def tenants_with_leases_due(now: datetime) -> list[int]:
    if rls.enforces_rls():
        return [tenant_id for (tenant_id,) in _TENANTS_WITH_LEASES_DUE.rows(now)]
    with dangerously_bypass_orm_scope():
        return sorted(
            set(
                GateLease.objects.filter(state=LeaseState.OUTSTANDING, settle_after__lte=now).values_list(
                    "tenant_id", flat=True
                )
            )
        )
