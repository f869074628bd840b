"""What the apps' `queries.py` modules (their SQL written for one database) share: which database
this is, and a cursor that binds parameters on the server. Only those modules, core and the
migrations ask which database this is (tests/controlplane/test_layering.py checks it)."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections


@cache
def is_postgres() -> bool:
    """Whether the database is Postgres: fixed by the settings for the process' life, so read once
    (the gate asks on every decision; each read of `connection` costs a thread-local lookup)."""
    return bool(connections[DEFAULT_DB_ALIAS].vendor == "postgresql")


def server_cursor() -> Any:
    """A server-side-binding psycopg cursor on Django's connection (same transaction), wrapped
    like Django's own cursors (error translation, query logging)."""
    import psycopg

    connection.ensure_connection()
    raw = psycopg.Cursor(connection.connection)
    # django-stubs types these as taking a CursorWrapper; Django passes them the DB-API cursor.
    if connection.queries_logged:
        return connection.make_debug_cursor(raw)  # type: ignore[arg-type]
    return connection.make_cursor(raw)  # type: ignore[arg-type]
