"""Set-based writes of tree nodes: what an integration round appends, in one statement.

The integrator computes every new perfect node of a round in memory (`merkle.CompactRange.extend`
from the stored frontier) and hands them here. On Postgres they go in as one `INSERT ... SELECT
FROM unnest(...)` of the positions (two array literals) beside one bytea of every hash, bound
server-side on the caller's connection (same transaction, same row-level security: `COPY FROM`
is refused on a table with RLS, and `unnest` is its equivalent for an INSERT). On SQLite, one
`executemany` of a plain INSERT. The ORM's `bulk_create` spent three quarters of an integration
building SQL text for these rows."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection
from sagaplane import merkle

from audit.bulk import is_postgres, server_cursor
from transparency.models import TreeNode

# Rows per statement: bounds the size of one bind (a 1M-leaf backlog round writes ~2M nodes).
_ROWS_PER_STATEMENT = 100_000


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
