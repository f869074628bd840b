"""Read-only questions other apps ask the fleet (recovery: which sagas are set aside). Every
query runs under the active tenant."""

from __future__ import annotations

from django.db.models import QuerySet

from fleet.models import Quarantine


def quarantined_saga_ids() -> QuerySet[Quarantine, str]:
    """Ids of the active tenant's sagas under a quarantine in force, as a query (usable as a
    subquery: `exclude(saga_id__in=quarantined_saga_ids())`)."""
    return Quarantine.objects.filter(released_at__isnull=True).values_list("saga_id", flat=True)


def is_quarantined(saga_id: str) -> bool:
    return quarantined_saga_ids().filter(saga_id=saga_id).exists()


def quarantine_of(saga_id: str) -> Quarantine | None:
    """The quarantine in force for this saga of the active tenant, if any."""
    return Quarantine.objects.filter(saga_id=saga_id, released_at__isnull=True).first()
