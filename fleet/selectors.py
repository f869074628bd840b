"""Read-only questions other apps ask the fleet (recovery: which sagas are set aside). Every
query runs under the active tenant."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import QuerySet

from fleet.models import Quarantine
from tenants.scoping import current_tenant


def quarantined_saga_ids() -> QuerySet[Quarantine, str]:
    """Ids of the active tenant's sagas under a quarantine in force, as a query (usable as a
    subquery: `exclude(saga_id__in=quarantined_saga_ids())`)."""
    return Quarantine.objects.filter(released_at__isnull=True).values_list("saga_id", flat=True)


def not_quarantined_sql(saga_column: str) -> tuple[str, list[Any]]:
    """The same question as a SQL condition on `saga_column` of another app's set-based
    statement (recovery's claim, one raw statement on Postgres): true when that saga is under no
    quarantine in force in the active tenant. (SQL text and its parameters.)"""
    table = connection.ops.quote_name(Quarantine._meta.db_table)
    return (
        f"NOT EXISTS (SELECT 1 FROM {table} q WHERE q.tenant_id = %s AND q.saga_id = {saga_column} "
        "AND q.released_at IS NULL)",
        [current_tenant().pk],
    )


def is_quarantined(saga_id: str) -> bool:
    return quarantined_saga_ids().filter(saga_id=saga_id).exists()


def quarantine_of(saga_id: str) -> Quarantine | None:
    """The quarantine in force for this saga of the active tenant, if any."""
    return Quarantine.objects.filter(saga_id=saga_id, released_at__isnull=True).first()
