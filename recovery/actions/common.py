"""What every recovery action shares: its limits, its error, the checks of free text, and
which jobs a claimer may take now."""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

from django.db.models import F, Model, Q, QuerySet

from fleet import selectors as fleet_selectors
from recovery.models import (
    Job,
    JobState,
    RunState,
)
from tenants.actors import system_actor

SYSTEM_ACTOR = system_actor("recovery")
DEFAULT_JOB_LEASE_S = 30.0
MAX_JOB_LEASE_S = 300.0
MAX_ATTEMPTS = 5
TEXT_MAX = 2000

_Row = TypeVar("_Row", bound=Model)


def quarantined_out(queryset: QuerySet[_Row]) -> QuerySet[_Row]:
    """`queryset` (of rows with a `saga_id`) without the sagas under a quarantine in force."""
    return queryset.exclude(saga_id__in=fleet_selectors.quarantined_saga_ids())


def claimable(now: datetime, delivery: str) -> QuerySet[Job]:
    """Jobs a claimer may take now (the one definition: claims, the sweep and webhook wake-ups
    ask it): ready (pending and due, or claimed with its lease run out and
    attempts left), of an active run, of a saga not quarantined, and at its run's frontier (the
    newest unfinished step: every later one is finished, so strictly newest first)."""
    ready = Q(state=JobState.PENDING, available_at__lte=now) | Q(
        state=JobState.CLAIMED, lease_expires_at__lt=now
    )
    return quarantined_out(
        Job.objects.filter(
            ready,
            run__state=RunState.ACTIVE,
            ordinal=F("run__frontier"),
            delivery=delivery,
            attempts__lt=F("max_attempts"),
        )
    )
