"""The one call the ingest path makes into the transparency log (ask: audit.services._store).

`records_appended(tenant)` requests an integration for after the ingest commits, so a signed
checkpoint follows acceptance in well under a second. Requests coalesce per tenant
(`tasks.request_integration`): a burst of batches queues one task, not one each. Without the hook
the 1 s beat (`transparency.integrate_grown_tenants`) still integrates every grown log; the hook
only cuts latency. It never runs integration inside the ingest transaction, and it is best
effort: ingest must not wait on, or fail because of, the log.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from controlplane.postcommit import after_commit
from tenants.models import Tenant

_integrator_running = contextvars.ContextVar("transparency_integrator_running", default=False)


@contextmanager
def integrator_appending() -> Iterator[None]:
    """The integrator's own appends (saga seals) are integrated by the same run, so they request
    nothing: otherwise every integration that sealed a saga would queue another one."""
    token = _integrator_running.set(True)
    try:
        yield
    finally:
        _integrator_running.reset(token)


def records_appended(tenant: Tenant) -> None:
    if _integrator_running.get():
        return
    tenant_id = tenant.pk

    def request() -> None:
        from transparency.tasks import request_integration

        request_integration(tenant_id)

    after_commit(f"integration request for tenant {tenant_id}", request)
