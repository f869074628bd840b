"""Postgres re-plans a growing tenant's records from fresh statistics sooner: autovacuum analyzes
the record tables after 2% of their rows changed instead of 10% (see sagas 0006). Nothing on
SQLite."""

from django.db import migrations

from core.statistics import analyze_sooner


class Migration(migrations.Migration):
    dependencies = [("audit", "0007_record_indexes_lead_with_tenant")]

    operations = [analyze_sooner("audit_record", "audit_recordpayload")]
