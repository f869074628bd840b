"""What the transparency log does when the record store grows (subscribed in `AppConfig.ready`
to `audit.hooks.after_records_committed`: audit does not import this app).

`records_committed(appended)` requests an integration once an ingest has committed, so a signed
checkpoint follows acceptance in well under a second. Requests coalesce per tenant
(`tasks.request_integration`): a burst of batches queues one task, not one each. Without the hook
the 1 s beat (`transparency.integrate_grown_tenants`) still integrates every grown log; the hook
only cuts latency. It never runs integration inside the ingest transaction, and it is best
effort (audit runs it through `controlplane.postcommit.after_commit`): ingest must not wait on,
or fail because of, the log.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from audit.hooks import AppendedRecords

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


def records_committed(appended: AppendedRecords) -> None:
    # audit runs this in the context variables of the append, so the integrator's flag holds.
    if _integrator_running.get():
        return
    from transparency.tasks import request_integration  # tasks imports this module

    request_integration(appended.tenant.pk)
