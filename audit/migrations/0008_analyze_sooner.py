"""Postgres re-plans a growing tenant's records from fresh statistics sooner: autovacuum analyzes
the record tables after 2% of their rows changed instead of 10% (see sagas 0006). Nothing on
SQLite."""

from django.db import migrations

TABLES = ("audit_record", "audit_recordpayload")


def analyze_sooner(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table in TABLES:
            schema_editor.execute(f"ALTER TABLE {table} SET (autovacuum_analyze_scale_factor = 0.02)", params=None)


def analyze_as_before(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table in TABLES:
            schema_editor.execute(f"ALTER TABLE {table} RESET (autovacuum_analyze_scale_factor)", params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0007_record_indexes_lead_with_tenant")]

    operations = [migrations.RunPython(analyze_sooner, analyze_as_before)]
