"""What the evidence store tells the apps built on top of it, without importing them.

`audit` sits below its consumers: the saga projection (`sagas`) and the transparency log
(`transparency`) read records and subscribe here from their `AppConfig.ready`; `audit` imports
neither (a test parses its imports). Three moments are offered:

- `on_records_appended(hook)`: inside the ingest transaction. `hook(appended)` is called before
  the tenant log lock is taken (the records' leaf indices are not known yet, so only lock-free
  reading and folding belongs there) and returns the function to call once the records are stored
  at leaf indices base, base+1, ... (under the lock, same transaction). An exception from either
  rolls the batch back: this is for work that must commit with the records or not at all.
- `after_records_committed(hook)`: best effort once the ingest transaction has committed
  (`core.postcommit.after_commit`): a failure is logged and never changes the answer.
  The hook runs in a copy of the context variables as they were when the records were appended,
  so "who appended" (e.g. the integrator's own seals) is still known after the commit.
- `on_payload_erased(hook)`: inside an erasure's transaction, after a record's payload is gone.

Hooks run in registration order. Registering the same function twice registers it once
(`ready()` may run more than once in a test process).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from core.postcommit import after_commit

if TYPE_CHECKING:
    from audit.models import Record
    from audit.queries import StoredRow
    from tenants.models import Tenant


@dataclass(frozen=True, slots=True)
class AppendedRecords:
    """One stream's newly appended records, in leaf order, each with its business fields (the
    payload as sent, without chain fields; empty for a record that arrived as a redacted stub)."""

    tenant: Tenant
    stream_id: str
    items: Sequence[tuple[StoredRow, dict[str, Any]]]
    actor: str = ""  # who shipped them ("api-key:<prefix>"), as the ingest's audit records name it


OnStored = Callable[[int], None]  # called with the first appended record's leaf index
InTransactionHook = Callable[[AppendedRecords], OnStored]
CommittedHook = Callable[[AppendedRecords], None]
ErasureHook = Callable[["Tenant", "Record"], None]

_in_transaction: list[InTransactionHook] = []
_committed: list[CommittedHook] = []
_erased: list[ErasureHook] = []


H = TypeVar("H")


def _register(hooks: list[H], hook: H) -> H:
    if hook not in hooks:
        hooks.append(hook)
    return hook


def on_records_appended(hook: InTransactionHook) -> InTransactionHook:
    return _register(_in_transaction, hook)


def after_records_committed(hook: CommittedHook) -> CommittedHook:
    return _register(_committed, hook)


def on_payload_erased(hook: ErasureHook) -> ErasureHook:
    return _register(_erased, hook)


# -- called by audit.services only -----------------------------------------------------------------


def records_appending(appended: AppendedRecords) -> list[OnStored]:
    """Before the tenant log lock: each in-transaction hook's preparation."""
    return [hook(appended) for hook in _in_transaction]


def records_stored(appended: AppendedRecords, on_stored: list[OnStored], base: int) -> None:
    """Under the lock, records stored from leaf index `base`: finish the in-transaction work and
    schedule the after-commit hooks."""
    for finish in on_stored:
        finish(base)
    for hook in _committed:
        name = getattr(hook, "__qualname__", repr(hook))
        after_commit(f"{name} for tenant {appended.tenant.pk}", _in_context(hook, appended))


def _in_context(hook: CommittedHook, appended: AppendedRecords) -> Callable[[], None]:
    context = contextvars.copy_context()
    return lambda: context.run(hook, appended)


def payload_erased(tenant: Tenant, record: Record) -> None:
    for hook in _erased:
        hook(tenant, record)
