"""The tenant's gate settings (`FleetSettings`, one row or none): how long a budget lease lives.

Read through the policy snapshot (`Policies.lease_ttl_ms`, kept under the tenant's epoch), so a
grant pays nothing for it; changed by `set_fleet_settings` with the old and new values recorded in
the tenant's server stream in the same transaction, then the change signal (every gate re-reads).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from sagaplane.events import Event

from core.actionaudit import append_server_record
from core.actors import Actor
from core.scoping import require_tenant
from fleet.actions.changes import changed_after_commit
from fleet.inputs import FleetSettingsChange
from fleet.models import FleetSettings
from tenants.models import Tenant


def default_lease_ttl_ms() -> int:
    """The deployment's lease TTL (SAGAPLANE_LEASE_TTL_MS, default 1 s): a tenant's when it set none."""
    return int(getattr(settings, "SAGAPLANE_LEASE_TTL_MS", 1000))


def settle_grace_ms() -> int:
    """How long after its expiry a lease its holder never returned is settled from its shipped WAL
    (SAGAPLANE_LEASE_SETTLE_GRACE_MS, default 2 s: what the holder's shipper sent before it died
    has been ingested by then)."""
    return int(getattr(settings, "SAGAPLANE_LEASE_SETTLE_GRACE_MS", 2000))


def stored_lease_ttl_ms() -> int | None:
    """The active tenant's own lease TTL (None: it set none). Inside its tenant context."""
    row = FleetSettings.objects.first()
    return None if row is None else row.lease_ttl_ms


def fleet_settings_values(tenant: Tenant) -> dict[str, Any]:
    """The tenant's gate settings as the API, the page and the audit records show them: what it
    set (`lease_ttl_ms`, null for the default) and what is in force (`lease_ttl_ms_effective`)."""
    require_tenant(tenant)
    stored = stored_lease_ttl_ms()
    return {"lease_ttl_ms": stored, "lease_ttl_ms_effective": stored or default_lease_ttl_ms()}


def set_fleet_settings(tenant: Tenant, change: FleetSettingsChange, *, actor: Actor) -> dict[str, Any]:
    """Set the tenant's gate settings (checked by `fleet.inputs.FleetSettingsUpdate`); recorded as
    FLEET_SETTINGS_UPDATED with old and new values in the same transaction. Leases granted before
    keep the TTL they were granted with (at most the old one). Nothing changed: nothing recorded."""
    require_tenant(tenant)
    with transaction.atomic():
        row = FleetSettings.objects.select_for_update().first()
        if row is None:
            FleetSettings.objects.bulk_create([FleetSettings(tenant=tenant)], ignore_conflicts=True)
            row = FleetSettings.objects.select_for_update().get()
        old = {"lease_ttl_ms": row.lease_ttl_ms}
        new = {"lease_ttl_ms": change.lease_ttl_ms}
        if old != new:
            row.lease_ttl_ms, row.updated_at = change.lease_ttl_ms, timezone.now()
            row.save(update_fields=["lease_ttl_ms", "updated_at"])
            append_server_record(tenant, Event.FLEET_SETTINGS_UPDATED, {"old": old, "new": new}, actor=actor)
            changed_after_commit(tenant)
    return fleet_settings_values(tenant)
