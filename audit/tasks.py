"""The evidence store's own transport: chaining the server records left pending (accepted with
their change by `audit.services.queue_server_records`, or behind a holder of the stream) as units
of work of their own, each entering the tenant. Called after a commit (the re-check an append or
a queue schedules) and by the walkers that chain what is left (the recovery sweep, the
reconciliation pass) outside any scope; services in a scope call `flush_server_records`."""

from __future__ import annotations

from audit.actions import server_stream
from audit.actions.server_stream import FLUSH_ROUNDS
from core.scoping import tenant_context, tenant_statements
from tenants.models import Tenant


def chain_pending_server_records(
    tenant: Tenant, *, wait: bool = False, rounds: int = FLUSH_ROUNDS, before: float | None = None
) -> int:
    """Chain the tenant's pending server records, FLUSH_BATCH per transaction as the tenant, until
    none is left or (unless `wait`) someone else holds the stream: its own re-check will chain
    them. With `before` (a Unix time), only when some row was accepted before it (left behind,
    not in flight: a periodic pass must not queue for the stream behind every result). Whether
    any is pending is one statement with no transaction around it on Postgres (every result's
    re-check asks, and mostly hears no). Returns how many this call chained."""
    done = 0
    for _ in range(rounds):
        with tenant_statements(tenant):
            if not server_stream.server_records_pending(tenant, before):
                break
        with tenant_context(tenant):
            chained = server_stream.chain_pending_batch(tenant, wait=wait)
        if not chained:
            break
        done += chained
    return done
