"""The lease watch: each saga's lease kept by the server's receive time of its records, in the
ingest transaction (an `audit.hooks` subscriber)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.utils import timezone
from sagaplane.events import Event

from audit.hooks import AppendedRecords, OnStored
from core.numbers import finite_number
from recovery.models import (
    Lease,
    LeaseState,
)
from tenants.models import Tenant

log = logging.getLogger(__name__)

MAX_LEASE_TTL = 1e9  # as the saga projection: longer is not a lease
LEASE_EVENTS = frozenset({Event.SAGA_START, Event.SAGA_LEASE})
END_EVENTS = frozenset({Event.SAGA_COMPLETE, Event.SAGA_ABORTED})


def _ttl(value: Any) -> float | None:
    if finite_number(value) and 0 < value <= MAX_LEASE_TTL:
        return float(value)
    return None


def watch_appended(appended: AppendedRecords) -> OnStored:
    """`audit.hooks` subscriber (inside the ingest transaction): keep each saga's lease by the
    server's receive time of its SAGA_START and SAGA_LEASE records, and close it on a terminal
    record. Nothing to do for a batch with none of these."""
    relevant = [
        (row, fields)
        for row, fields in appended.items
        if row.saga_id and row.event in LEASE_EVENTS | END_EVENTS
    ]

    def stored(base: int) -> None:
        if relevant:
            _update_leases(appended.tenant, relevant)

    return stored


def _update_leases(tenant: Tenant, items: Sequence[tuple[Any, dict[str, Any]]]) -> None:
    saga_ids = list(dict.fromkeys(row.saga_id for row, _ in items))
    leases = {lease.saga_id: lease for lease in Lease.objects.filter(saga_id__in=saga_ids)}
    new: dict[str, Lease] = {}
    for row, fields in items:
        lease = leases.get(row.saga_id) or new.get(row.saga_id)
        if lease is None:
            lease = new[row.saga_id] = Lease(tenant=tenant, saga_id=row.saga_id)
        if lease.state != LeaseState.LIVE:
            if lease.state == LeaseState.SWEPT and row.event in LEASE_EVENTS:
                log.warning("saga %s renewed its lease after recovery took it over", row.saga_id)
            continue
        if row.event in END_EVENTS:
            lease.state = LeaseState.ENDED
            continue
        if row.event == Event.SAGA_START:
            ttl = _ttl((fields or {}).get("lease_ttl"))
            lease.lease_ttl = ttl if ttl is not None else lease.lease_ttl
        when = row.received_at or timezone.now()
        if lease.renewed_at is None or when > lease.renewed_at:
            lease.renewed_at = when
        if lease.lease_ttl and lease.renewed_at is not None:
            try:
                lease.expires_at = lease.renewed_at + timedelta(seconds=lease.lease_ttl)
            except OverflowError:
                lease.expires_at = None
    if new:
        Lease.objects.bulk_create(new.values(), ignore_conflicts=True)
    if leases:
        Lease.objects.bulk_update(leases.values(), ["lease_ttl", "renewed_at", "expires_at", "state"])
