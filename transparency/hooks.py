"""What the transparency log does when the record store grows (subscribed in `AppConfig.ready`
to `audit.hooks.after_records_committed`: audit does not import this app).

`records_committed(appended)` requests an integration and a seal pass once an ingest has committed,
so a signed checkpoint (and the seal of a saga the batch finished) follows acceptance in well
under a second. Requests coalesce per tenant and kind (`tasks.request_integration`,
`tasks.request_sealing`): a burst of batches queues one task of each, not one each. Without the
hook the 1 s beat (`transparency.integrate_grown_tenants`) still seals and integrates every grown
log; the hook only cuts latency. It never runs integration inside the ingest transaction, and it is best
effort (audit runs it through `core.postcommit.after_commit`): ingest must not wait on,
or fail because of, the log.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from audit.hooks import AppendedRecords

_sealer_running = contextvars.ContextVar("transparency_sealer_running", default=False)


@contextmanager
def sealer_appending() -> Iterator[None]:
    """The sealer's own appends (saga seals) request nothing here: the sealer requests the
    integration that signs them itself, and a seal never needs sealing (seal passes skip seals),
    so a seal pass that appended would otherwise only queue another, empty, seal pass."""
    token = _sealer_running.set(True)
    try:
        yield
    finally:
        _sealer_running.reset(token)


def records_committed(appended: AppendedRecords) -> None:
    # audit runs this in the context variables of the append, so the sealer's flag holds.
    if _sealer_running.get():
        return
    from transparency.tasks import request_integration, request_sealing  # tasks imports this module

    request_integration(appended.tenant.pk)
    request_sealing(appended.tenant.pk)
