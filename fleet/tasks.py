"""The fleet's periodic work (walkers across tenants, each entering one tenant per unit of work),
and the circuit breakers' counting of an ingest's step outcomes once it has committed: both
transports, which enter the tenant around each unit of work."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from celery import shared_task
from django.utils import timezone

from audit.hooks import AppendedRecords
from core import epoch
from core.errors import DomainError
from core.scoping import tenant_context
from fleet import services
from fleet.cross_tenant import tenants_with_leases_due
from fleet.stores import LimitStore
from tenants.entry import tenant_by_id
from tenants.models import Tenant

log = logging.getLogger(__name__)


def outcomes_committed(appended: AppendedRecords) -> None:
    """`audit.hooks` subscriber (after the ingest committed, best effort): count the batch's step
    outcomes for every breaker whose tool they match (`fleet.actions.breaker_states`). A batch
    without step outcomes, or a tenant without breakers, costs no read beyond the tenant's epoch
    while this process holds its policies. Each count and each transition enters the tenant and
    commits on its own (a transition is one transaction; a count stands without the trip it
    causes, which re-checks the breaker's row)."""
    outcomes = services.breaker_outcomes_in(appended)
    if not outcomes:
        return
    tenant = appended.tenant
    version = epoch.read(tenant.pk)
    breakers = services.held_breakers(tenant, version)
    if breakers is None:
        with tenant_context(tenant):
            breakers = services.read_breakers(tenant, version)
    for met in services.breakers_met(breakers, outcomes):
        if met.trial is not None:
            with tenant_context(tenant):
                services.settle_trial(tenant, met.spec, failed=met.trial.failed)
            continue
        with tenant_context(tenant):
            reason = services.count_breaker_outcomes(tenant, met.spec, met.outcomes)
        if reason is not None:
            with tenant_context(tenant):
                services.trip(tenant, met.spec, reason)


PRUNE_BATCHES = 100  # a tenant's batches of each kind per pass: at most 500,000 rows an hour


@shared_task(name="fleet.prune_old_rows")
def prune_old_rows(now: datetime | None = None) -> dict[str, int]:
    """Every tenant's rows past their retention go, each tenant entered in turn, a batch at a
    time (each batch a transaction of its own, so no lock is held long): refusals older than 30
    days (allows, the ledger, stay forever) and lease uses no settlement will read. How many of
    each."""
    now = now or timezone.now()
    pruned = {"denials": 0, "lease_uses": 0}
    for tenant in Tenant.objects.order_by("pk").iterator():
        pruned["denials"] += prune_denials_of(tenant, now=now)
        pruned["lease_uses"] += prune_lease_uses_of(tenant, now=now)
    return pruned


def prune_denials_of(
    tenant: Tenant, *, now: datetime, batch: int | None = None, batches: int = PRUNE_BATCHES
) -> int:
    """The tenant's refusals past retention, at most `batches` batches of `batch` rows."""
    limit = batch or services.DENIALS_PRUNE_BATCH
    return _in_batches(tenant, lambda: services.prune_denials(tenant, now=now, limit=limit), limit, batches)


def prune_lease_uses_of(
    tenant: Tenant,
    *,
    now: datetime,
    kept_for: timedelta | None = None,
    batch: int | None = None,
    batches: int = PRUNE_BATCHES,
) -> int:
    """The tenant's lease uses past retention (ARCHITECTURE §8.3), at most `batches` batches of
    `batch` rows; what is left waits for the next pass. How many were deleted."""
    kept = services.LEASE_USES_KEPT_FOR if kept_for is None else kept_for
    limit = batch or services.LEASE_PRUNE_BATCH

    def prune() -> int:
        return services.prune_lease_uses(tenant, now=now, kept_for=kept, limit=limit)

    return _in_batches(tenant, prune, limit, batches)


def _in_batches(tenant: Tenant, prune: Callable[[], int], limit: int, batches: int) -> int:
    """`prune` (one batch of at most `limit` rows) in the tenant, each call in a transaction of
    its own, until a batch comes back short or `batches` ran. How many rows went."""
    deleted = 0
    for _ in range(batches):
        with tenant_context(tenant):
            taken = prune()
        deleted += taken
        if taken < limit:
            break
    return deleted


@shared_task(name="fleet.settle_expired_leases", ignore_result=True)
def settle_expired_leases(now: datetime | None = None) -> int:
    """Every tenant's budget leases that expired unreturned, settled (ARCHITECTURE §8.3); how many
    were. Run every second by the beat process' sweep thread (recovery/sweeper.py) through
    `services.settle_all_expired_leases`, never by a message a busy queue could starve; still a
    task, so an operator can run one pass by hand. A tenant whose settlement fails is logged and
    left for the next pass."""
    now = now or timezone.now()
    settled = 0
    for tenant_id in tenants_with_leases_due(now):
        tenant = tenant_by_id(tenant_id)
        if tenant is None:
            continue
        try:
            settled += settle_tenant(tenant, now=now)
        except Exception:
            log.exception("lease settlement of tenant %s failed; the next pass retries", tenant_id)
    return settled


def settle_tenant(tenant: Tenant, *, now: datetime | None = None, store: LimitStore | None = None) -> int:
    """Settle the tenant's leases due by `now` (at most one claim's batch); how many were settled.
    The claim commits on its own, then each lease is settled in a transaction of its own, so one
    that cannot be settled now (the limit store is down) rolls back alone and its claim lapses."""
    now = now or timezone.now()
    with tenant_context(tenant):
        taken = services.claim_due_leases(tenant, now=now)
    settled = 0
    for row in taken:
        try:
            with tenant_context(tenant):
                settled += services.settle_lease(tenant, row.pk, row.settle_token, store=store)
        except DomainError as exc:
            log.warning("gate: lease %s not settled now: %s", row.pk, exc.detail)
    return settled
