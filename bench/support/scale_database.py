"""bench/scale.py's database: its own Postgres database beside DATABASE_URL's, the owner's
ANALYZE (autovacuum's stand-in on a server running without it), and what the tables and the
planner say at each rung (sizes, index blocks read, the tool filters' plans)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import urllib.parse
from typing import Any

TABLES = ["audit_record", "audit_recordpayload", "transparency_treenode", "sagas_saga", "sagas_step"]


def beside(base: str, path: str) -> str:
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(base)._replace(path=path))


def admin_url(owner: str) -> str:
    return beside(owner, "/postgres").replace("postgres://", "postgresql://", 1)


def own_database(fresh: bool) -> tuple[str, str, str] | None:
    """(runtime URL, owner URL, name) of `<name>_bench_scale` (`..._quick` when `fresh`: a quick run
    never touches a full run's database), created by the owner role, dropped first when `fresh`."""
    url, owner = os.environ.get("DATABASE_URL", ""), os.environ.get("DATABASE_OWNER_URL", "")
    if not url.startswith(("postgres://", "postgresql://")) or not owner:
        return None
    import psycopg

    name = f"{urllib.parse.urlsplit(url).path.lstrip('/') or 'sagaplane'}_bench_scale"
    name += "_quick" if fresh else ""
    with psycopg.connect(admin_url(owner), autocommit=True) as c:
        if fresh:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            c.execute(f'CREATE DATABASE "{name}"')
    return beside(url, f"/{name}"), beside(owner, f"/{name}"), name


def drop_database(owner_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url(owner_url), autocommit=True) as c:
        # The runtime role's sessions may still be closing (a pool closes its connections in the
        # background), and the owner may not terminate another role's session: WITH (FORCE) then
        # fails (seen in CI on a loaded machine). Wait for them to go, at most 30 s.
        deadline = time.monotonic() + 30
        while (
            time.monotonic() < deadline
            and c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND usename <> current_user", [name]
            ).fetchone()[0]
        ):
            time.sleep(0.1)
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def as_owner() -> Any:
    """An autocommit connection as the tables' owner (what ANALYZE needs), or None without one."""
    owner = os.environ.get("DATABASE_OWNER_URL", "")
    if not owner:
        yield None
        return
    import psycopg

    with psycopg.connect(owner.replace("postgres://", "postgresql://", 1), autocommit=True) as c:
        yield c


GROWING_TABLES = (
    "audit_record",
    "audit_recordpayload",
    "sagas_saga",
    "sagas_step",
    "transparency_treenode",
    "recovery_lease",
)


ANALYZED: dict[str, Any] = {"server_autovacuum": None, "analyzes": 0}


def autovacuum_stand_in() -> None:
    """On a server running with `autovacuum = off` (this machine's shared Postgres does), ANALYZE
    each growing table once its changes since the last ANALYZE pass autovacuum's own trigger
    (`autovacuum_analyze_threshold` + `autovacuum_analyze_scale_factor` x its rows: 50 + 10% by
    default, the table's own settings first), as autovacuum would in production. Without it a
    grown tenant's tables are never analyzed, and the planner's guesses for them (a tenant of
    1.2M steps taken for 748 rows) are not what a production tenant meets. With autovacuum on,
    nothing: the server does it."""
    with as_owner() as c:
        if c is None:
            return
        settings = dict(
            c.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('autovacuum', 'autovacuum_analyze_threshold', 'autovacuum_analyze_scale_factor')"
            ).fetchall()
        )
        ANALYZED["server_autovacuum"] = settings["autovacuum"]
        if settings["autovacuum"] == "on":
            return
        threshold = float(settings["autovacuum_analyze_threshold"])
        factor = float(settings["autovacuum_analyze_scale_factor"])
        due = []
        for name, changed, rows, options in c.execute(
            "SELECT s.relname, s.n_mod_since_analyze, greatest(c.reltuples, s.n_live_tup), c.reloptions "
            "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid WHERE s.relname = ANY(%s)",
            [list(GROWING_TABLES)],
        ).fetchall():
            # A table's own setting first (the migrations set 0.02 on the record and saga tables).
            own = dict(option.split("=", 1) for option in options or [])
            table_factor = float(own.get("autovacuum_analyze_scale_factor", factor))
            if changed > float(own.get("autovacuum_analyze_threshold", threshold)) + table_factor * rows:
                due.append(name)
        for name in due:
            c.execute(f"ANALYZE {name}")
            ANALYZED["analyzes"] += 1


def analyze_sagas() -> None:
    """ANALYZE the saga tables (as their owner), as autovacuum would have by now: growing a table
    by a million rows in minutes outruns it, and stale statistics are not what a tenant meets."""
    with as_owner() as c:
        if c is not None:
            c.execute("ANALYZE sagas_saga, sagas_step")


def table_sizes(records: int) -> dict[str, Any] | None:
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    out: dict[str, Any] = {}
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute("SELECT pg_table_size(%s), pg_indexes_size(%s)", [table, table])
            table_bytes, index_bytes = cursor.fetchone()
            per = records / 1_000_000
            out[table] = {
                "table_mib_per_million": round(table_bytes / per / 2**20, 1),
                "index_mib_per_million": round(index_bytes / per / 2**20, 1),
            }
        cursor.execute("SELECT pg_database_size(current_database())")
        out["database_gib"] = round(cursor.fetchone()[0] / 2**30, 2)
    out["disk_free_gib"] = round(shutil.disk_usage("/").free / 2**30, 1)
    return out


def index_blocks() -> dict[str, tuple[int, int]]:
    """Blocks each index of the big tables read from outside shared_buffers, and found in them."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexrelname, idx_blks_read, idx_blks_hit FROM pg_statio_user_indexes"
            " WHERE relname = ANY(%s)",
            [TABLES],
        )
        return {name: (read, hit) for name, read, hit in cursor.fetchall()}


def blocks_per_1000(before: dict[str, tuple[int, int]], records: int) -> dict[str, float]:
    """Index blocks read from outside shared_buffers per 1,000 records since `before`, the five
    largest (the random-order index shows up here; indexes that grow in order barely read)."""
    after = index_blocks()
    delta = {name: after[name][0] - before.get(name, (0, 0))[0] for name in after}
    top = sorted(delta.items(), key=lambda kv: -kv[1])[:5]
    return {name: round(read * 1000 / records, 1) for name, read in top if records}


def tool_plans(tenant: Any) -> dict[str, list[str]] | None:
    """EXPLAIN ANALYZE of the list's first page by a common and a rare tool, as the API runs it:
    the runtime role, the tenant active (row-level security on)."""
    from django.db import connection

    from core.scoping import tenant_context
    from sagas import selectors

    if connection.vendor != "postgresql":
        return None
    out = {}
    with tenant_context(tenant):
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            role = cursor.fetchone()[0]
        for tool in ("tool.1", "tool.rare"):
            page = selectors.newest_first(selectors.with_step_tool(selectors.all_sagas(), tool))[:51]
            # the planner's own choice for the EXISTS form (why newest_page bounds its walk)
            out[f"EXISTS tool={tool} (as {role})"] = page.explain(analyze=True, buffers=True).splitlines()
    return out
