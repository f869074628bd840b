"""What every long-poll does between two reads: give its database connection back."""

from __future__ import annotations

from django.db import connection


def release_connection() -> None:
    """Return this thread's database connection (to the pool, or closed) before a long-poll
    waits, unless a transaction holds it. A held connection per waiting client took a process's
    whole pool (DB_POOL_MAX_SIZE): with a handful of SDKs long-polling, every other request in
    that process waited DB_POOL_TIMEOUT for a connection and failed. The next read reconnects."""
    if not connection.in_atomic_block:
        connection.close()
