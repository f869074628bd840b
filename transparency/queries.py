"""The transparency log's vendor-specific SQL, all of it (issue 25): each query answers the same on
every database (tests/transparency/test_queries.py runs each on Postgres and on SQLite); elsewhere
the log speaks the ORM.

- `insert_nodes`: what an integration round appends, in one statement. The integrator computes
  every new perfect node of a round in memory (`merkle.CompactRange.extend` from the stored
  frontier) and hands them here. On Postgres they go in as one `INSERT ... SELECT FROM
  unnest(...)` of the positions (two array literals) beside one bytea of every hash, bound
  server-side on the caller's connection (same transaction, same row-level security: `COPY FROM`
  is refused on a table with RLS, and `unnest` is its equivalent for an INSERT). On SQLite, one
  `executemany` of a plain INSERT. The ORM's `bulk_create` spent three quarters of an integration
  building SQL text for these rows.
- `tree_nodes`: stored nodes by (level, index), and beside them (`with_latest`) the size of the
  latest signed checkpoint, in one statement: what makes a proof one statement on Postgres.
- `leaf_hashes`: stored leaf hashes in leaf order, through a plain cursor.

The tenant is each query's argument, never left to the active scope: these run inside the
caller's tenant transaction, and on SQLite nothing else would filter them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection
from sagaplane import merkle

from audit.models import Record
from core.sql import is_postgres, server_cursor
from transparency.models import Checkpoint, TreeNode

# Rows per statement: bounds the size of one bind (a 1M-leaf backlog round writes ~2M nodes).
_ROWS_PER_STATEMENT = 100_000
# SQLite caps a compound SELECT at 500 terms.
_CHUNK = 200


def _names() -> tuple[str, str]:
    return connection.ops.quote_name(TreeNode._meta.db_table), connection.ops.quote_name("index")


def insert_nodes(tenant_id: int, nodes: Sequence[merkle.Node]) -> None:
    """Append `nodes` (new perfect subtrees, none stored yet) for the tenant, in the caller's
    transaction. A node already stored is a unique-constraint error: the caller's state is wrong."""
    if not nodes:
        return
    table, index = _names()
    if is_postgres():
        # Positions as array literals (str.join runs in C) and the hashes as one bytea cut into
        # 32-byte pieces by the server: psycopg's binary dump of three Python lists, element by
        # element, was most of a round's time writing nodes.
        size = merkle.HASH_SIZE
        sql = (
            f"INSERT INTO {table} (tenant_id, level, {index}, hash) "
            f"SELECT %(tenant)s, l, i, substring(%(hashes)b FROM ((o - 1) * {size} + 1)::int FOR {size}) "
            "FROM unnest(%(level)s::smallint[], %(index)s::bigint[]) WITH ORDINALITY AS u(l, i, o)"
        )
        with server_cursor() as cursor:
            for start in range(0, len(nodes), _ROWS_PER_STATEMENT):
                chunk = nodes[start : start + _ROWS_PER_STATEMENT]
                cursor.execute(
                    sql,
                    {
                        "tenant": tenant_id,
                        "level": "{" + ",".join([str(n.level) for n in chunk]) + "}",
                        "index": "{" + ",".join([str(n.index) for n in chunk]) + "}",
                        "hashes": b"".join([n.hash for n in chunk]),
                    },
                )
        return
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} (tenant_id, level, {index}, hash) VALUES (%s, %s, %s, %s)",
            [(tenant_id, n.level, n.index, n.hash) for n in nodes],
        )


def one_statement_proofs() -> bool:
    """Whether `tree_nodes` reads the latest signed size in the nodes' own statement (Postgres), so
    a proof planned against a size seen before is one statement."""
    return is_postgres()


def tree_nodes(
    tenant_id: int, wanted: Sequence[tuple[int, int]], *, with_latest: bool
) -> tuple[list[tuple[int, int, Any]], int | None]:
    """The tenant's stored nodes among `wanted` (level, index), as (level, index, hash) rows in no
    particular order; with `with_latest`, beside them the size of the latest signed checkpoint
    (None when there is none).

    Postgres: one index probe per wanted node, joined to `unnest` of the wanted (level, index)
    arrays, so the statement's text (and its planning) does not grow with the proof; the latest
    size is a UNION ALL arm of the same statement. SQLite: a UNION ALL of point lookups, so each
    arm uses the (tenant, level, index) unique index (an OR or row-value IN lets SQLite's planner
    fall back to a scan of the tenant's nodes), and the latest size its own statement."""
    table, column = _names()
    if is_postgres():
        sql = (
            f"SELECT level, {column}, hash FROM {table} WHERE tenant_id = %s AND (level, {column}) IN "
            "(SELECT * FROM unnest(%s::smallint[], %s::bigint[]))"
        )
        params: list[Any] = [tenant_id, [k[0] for k in wanted], [k[1] for k in wanted]]
        if with_latest:
            checkpoints = connection.ops.quote_name(Checkpoint._meta.db_table)
            sql += (
                f" UNION ALL (SELECT -1, size, NULL FROM {checkpoints} WHERE tenant_id = %s "
                "ORDER BY id DESC LIMIT 1)"
            )
            params.append(tenant_id)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if not with_latest:
            return rows, None
        latest = None
        nodes = []
        for row in rows:
            if row[0] < 0:
                latest = row[1]
            else:
                nodes.append(row)
        return nodes, latest
    arm = f"SELECT level, {column}, hash FROM {table} WHERE tenant_id = %s AND level = %s AND {column} = %s"
    found: list[tuple[int, int, Any]] = []
    with connection.cursor() as cursor:
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start : start + _CHUNK]
            cursor.execute(
                " UNION ALL ".join([arm] * len(chunk)),
                [value for level, index in chunk for value in (tenant_id, level, index)],
            )
            found.extend(cursor.fetchall())
    if not with_latest:
        return found, None
    # Only the parity test asks this of SQLite: proofs read the latest size beside the nodes on
    # Postgres alone (`one_statement_proofs`).
    checkpoints = connection.ops.quote_name(Checkpoint._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT size FROM {checkpoints} WHERE tenant_id = %s ORDER BY id DESC LIMIT 1", [tenant_id]
        )
        latest = cursor.fetchone()
    return found, None if latest is None else latest[0]


def leaf_hashes(tenant_id: int, start: int, end: int) -> list[bytes]:
    """Stored leaf hashes of the tenant's leaves [start, end), in leaf order; stops short at a hole.

    One statement on the (tenant, leaf_index) unique index, through a plain cursor: the ORM's
    per-row model machinery cost more than the read itself for a round of 50,000 leaves."""
    quote = connection.ops.quote_name
    sql = (
        f"SELECT leaf_index, leaf_hash FROM {quote(Record._meta.db_table)} "
        "WHERE tenant_id = %s AND leaf_index >= %s AND leaf_index < %s ORDER BY leaf_index"
    )
    out: list[bytes] = []
    with connection.cursor() as cursor:
        cursor.execute(sql, [tenant_id, start, end])
        for expected, (index, digest) in enumerate(cursor.fetchall(), start):
            if index != expected:
                break  # a hole: the caller sees a short list and refuses
            out.append(bytes(digest))
    return out
