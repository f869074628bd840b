"""The evidence store's public surface: the actions other apps, the API and the tests call. The
actions themselves live in `audit.actions` (one module per concern; its docstring tells the
model); this module only re-exports them, so callers have one stable place to import from. Beside
them, the one transport a walker in another app calls (`chain_pending_server_records`, entering
the tenant per batch: the recovery sweep, the reconciliation pass)."""

from __future__ import annotations

from audit.actions.common import IngestRefused, IngestResult
from audit.actions.erasure import redact, stored_record
from audit.actions.ingest import ingest, ingest_by_linkage
from audit.actions.server_stream import (
    append_server_record,
    append_server_records,
    flush_server_records,
    pending_server_records,
    queue_server_records,
)
from audit.actions.verification import held_by_hash
from audit.tasks import chain_pending_server_records

__all__ = [
    "IngestRefused",
    "IngestResult",
    "append_server_record",
    "append_server_records",
    "chain_pending_server_records",
    "flush_server_records",
    "held_by_hash",
    "ingest",
    "ingest_by_linkage",
    "pending_server_records",
    "queue_server_records",
    "redact",
    "stored_record",
]
