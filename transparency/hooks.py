"""The one call the ingest path makes into the transparency log (ask: audit.services._store).

`records_appended(tenant)` schedules an integration for after the ingest commits, so a signed
checkpoint follows acceptance in well under a second. Without it the 1 s beat
(`transparency.integrate_grown_tenants`) still integrates every grown log; the hook only cuts
latency. It never runs integration inside the ingest transaction: ingest must not wait on, or
fail because of, the log.
"""

from __future__ import annotations

from controlplane.postcommit import after_commit
from tenants.models import Tenant


def records_appended(tenant: Tenant) -> None:
    tenant_id = tenant.pk

    def enqueue() -> None:
        from transparency.tasks import integrate_tenant

        integrate_tenant.delay(tenant_id)

    after_commit(f"integration request for tenant {tenant_id}", enqueue)
