"""Approvals' periodic work: deadlines, warnings, escalation, lapsed approvals."""

from __future__ import annotations

from celery import shared_task

from approvals import services
from core.scoping import tenant_context
from tenants.models import Tenant


@shared_task(name="approvals.sweep")
def sweep() -> dict[str, int]:
    """Every tenant's requests: expired past their deadline (a denial), warned before it, escalated
    on schedule; approvals not used within their execution window lapse."""
    totals = {"expired": 0, "warned": 0, "escalated": 0, "lapsed": 0}
    for tenant in Tenant.objects.order_by("pk").iterator():
        with tenant_context(tenant):  # each tenant its own transaction
            swept = services.sweep(tenant)
        for kind, count in swept.items():
            totals[kind] += count
    return totals
