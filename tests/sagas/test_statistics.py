"""The growing tables are re-analyzed sooner than autovacuum's default, and the hot ones keep no
lone tenant or saga index a stale plan could scan (core.statistics, their migrations)."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

GROWING = [
    "audit_record",
    "audit_recordpayload",
    "sagas_saga",
    "sagas_step",
    "recovery_lease",
    "transparency_treenode",
]
UNINDEXED = ["sagas_saga", "sagas_step", "recovery_lease", "transparency_treenode"]


def test_the_growing_tables_are_analyzed_after_two_percent_of_changes() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s)", [GROWING])
        options = dict(cursor.fetchall())
    assert set(options) == set(GROWING)
    for table in GROWING:
        assert "autovacuum_analyze_scale_factor=0.02" in (options[table] or []), table


def test_the_hot_tables_have_no_single_column_tenant_or_saga_index() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = ANY(%s) "
            "AND (indexdef LIKE '%%(tenant_id)' OR indexdef LIKE '%%(saga_id)')",
            [UNINDEXED],
        )
        assert cursor.fetchall() == []
