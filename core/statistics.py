"""How soon Postgres re-plans a fast-growing table from fresh statistics: a migration operation
that asks autovacuum to analyze some tables after a smaller share of changes than its default 10%
(a tenant growing fast between two ANALYZEs gets plans made for a much smaller tenant: see
docs/SCALING.md). Nothing on other databases."""

from __future__ import annotations

from typing import Any

from django.db import migrations

ANALYZE_SCALE_FACTOR = 0.02


def analyze_sooner(*tables: str) -> migrations.RunPython:
    """The operation: `autovacuum_analyze_scale_factor` = ANALYZE_SCALE_FACTOR on `tables`
    (reversed: the server's default again)."""

    def forward(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            for table in tables:
                schema_editor.execute(
                    f"ALTER TABLE {table} SET (autovacuum_analyze_scale_factor = {ANALYZE_SCALE_FACTOR})",
                    params=None,
                )

    def backward(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            for table in tables:
                schema_editor.execute(
                    f"ALTER TABLE {table} RESET (autovacuum_analyze_scale_factor)", params=None
                )

    return migrations.RunPython(forward, backward)


def unindex_tenant(model_name: str, table: str, index: str) -> migrations.SeparateDatabaseAndState:
    """The operation that takes `index`, a model's lone index on `tenant_id`, away (the model's
    `tenant` becomes `tenant_field(db_index=False)`): only the index is dropped, on any database
    (Django names it alike everywhere). Django's own AlterField would drop and re-add the foreign
    key as well, re-validating every row under lock (minutes at 10M records)."""
    from core.scoping import tenant_field

    return migrations.SeparateDatabaseAndState(
        database_operations=[
            migrations.RunSQL(
                f'DROP INDEX IF EXISTS "{index}"',
                reverse_sql=f'CREATE INDEX IF NOT EXISTS "{index}" ON "{table}" ("tenant_id")',
            )
        ],
        state_operations=[
            migrations.AlterField(model_name=model_name, name="tenant", field=tenant_field(db_index=False))
        ],
    )
