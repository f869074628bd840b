"""The action-audit writer: the one door through which every app's state change writes its
audit record, in the caller's transaction (so the record commits or rolls back with the change).

The writer itself is the evidence store's (`audit.services.append_server_records`: chained records
on the tenant's server stream), registered when the `audit` app is ready. Core names the door so
that an app below the evidence store (`tenants`: members, keys, invitations) records its changes
the way every other app does, without importing it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from core.actors import Actor, stored
from core.scoping import Tenant

Writer = Callable[..., object]
"""`(tenant, [(event, fields), ...], *, actor)`: appends the records in the caller's transaction."""

_writer: Writer | None = None


def register(writer: Writer) -> None:
    """Install the writer (the audit app's `ready`); once per process."""
    global _writer
    _writer = writer


def append_server_records(
    tenant: Tenant, entries: Sequence[tuple[str, dict[str, Any]]], *, actor: Actor
) -> None:
    """Record several changes (event, fields) of `tenant`, made by `actor`, as one batch."""
    if _writer is None:
        raise RuntimeError("no action-audit writer: the audit app must be installed")
    stored(actor)  # a plain string is refused here, whoever the writer is
    _writer(tenant, entries, actor=actor)


def append_server_record(tenant: Tenant, event: str, fields: dict[str, Any], *, actor: Actor) -> None:
    """Record one change of `tenant` (its event and fields), made by `actor`."""
    append_server_records(tenant, [(event, fields)], actor=actor)
