"""Postgres re-plans a growing tenant's projection from fresh statistics sooner: autovacuum
analyzes these tables after 2% of their rows changed instead of 10% (its default). The fold reads
a batch's sagas and steps by id; with statistics from before a tenant's growth the planner took the
tenant for a few hundred rows and scanned all of its steps through `sagas_step_tool_saga` instead
(docs/SCALING.md: 86 ms a batch instead of 5 at 2M records). Nothing on SQLite."""

from django.db import migrations

TABLES = ("sagas_saga", "sagas_step")


def analyze_sooner(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table in TABLES:
            schema_editor.execute(f"ALTER TABLE {table} SET (autovacuum_analyze_scale_factor = 0.02)", params=None)


def analyze_as_before(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table in TABLES:
            schema_editor.execute(f"ALTER TABLE {table} RESET (autovacuum_analyze_scale_factor)", params=None)


class Migration(migrations.Migration):
    dependencies = [("sagas", "0005_redundant_indexes")]

    operations = [migrations.RunPython(analyze_sooner, analyze_as_before)]
