"""The gate's limit store (one per process), the tenant's hash tag in it, and the ledger a Redis
rebuild replays (`ledger_since`). That read is an entry into a tenant of its own (listed in the
layering test's TENANT_ENTRY_MODULES): the store finds a tenant's counters cold by the tenant's
id wherever it is asked, in a gate decision or a lease inside the tenant's scope as well as in the
outage probe's thread across tenants (`RedisStore.make_ready`), and the rebuild is the one place
it reads the database."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from core import snapshots
from core.scoping import tenant_context
from fleet.models import Decision, GateDecision, GateLease
from fleet.stores import DatabaseStore, LedgerEntry, LimitStore, RedisStore
from tenants.models import Tenant

# ----------------------------------------------------------------------------------------- the store

_store: LimitStore | None = None


def get_store() -> LimitStore:
    """Redis when configured (SAGAPLANE_GATE_STORE=redis, the default with REDIS_URL), else the
    database. One per process; `set_store` swaps it (tests, benchmarks)."""
    global _store
    if _store is None:
        _store = _configured_store()
    return _store


def set_store(store: LimitStore | None) -> None:
    global _store
    _store = store


def _configured_store() -> LimitStore:
    if settings.SAGAPLANE_GATE_STORE == "redis":
        import redis

        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0, health_check_interval=30
        )
        return RedisStore(client, ledger_since)
    return DatabaseStore()


def gate_tag(tenant: Tenant) -> str:
    """The hash tag of every Redis key of the tenant's gate: its id and creation time, so a
    database re-created beside a Redis that outlived it (ids counting from 1 again, as every test
    run does) never inherits another tenant's counters."""
    return snapshots.tenant_key(tenant)


def ledger_since(tenant_id: int, since_ms: int) -> list[LedgerEntry]:
    """The tenant's allowed decisions and leases since `since_ms` (what a Redis rebuild replays): a
    lease as what it counts (`GateLease.counted`) in the bucket of its grant, a reservation as
    its debits hold (the reserve while open, the actual once settled) in the bucket of its debit.
    Enters the tenant itself: the store knows it only by its id (see the module)."""
    tenant = Tenant.objects.get(pk=tenant_id)
    since = datetime.fromtimestamp(since_ms / 1000, tz=timezone.get_current_timezone())
    with tenant_context(tenant):
        rows = GateDecision.objects.filter(decision=Decision.ALLOW, decided_at__gte=since).values_list(
            "id", "idempotency_key", "decided_at", "debits", "detail"
        )
        entries = [
            LedgerEntry(str(pk), key, _debited_ms(decided_at, detail), debits)
            for pk, key, decided_at, debits, detail in rows.iterator()
        ]
        for lease in GateLease.objects.filter(granted_ms__gte=since_ms):
            debits = [{**d, "amount": units} for d, units in zip(lease.debits, lease.counted(), strict=True)]
            entries.append(LedgerEntry(str(lease.pk), f"lease:{lease.pk}", lease.granted_ms, debits))
        return entries


def _debited_ms(decided_at: datetime, detail: dict[str, Any]) -> int:
    """When an allow debited the store: a reservation keeps the store's clock (where it settles)."""
    held = detail.get("reservation") if isinstance(detail, dict) else None
    return int(held["store_ms"]) if held else int(decided_at.timestamp() * 1000)
