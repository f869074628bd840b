"""Record headers are append-only in the database itself, not only by convention: on Postgres a
trigger refuses every UPDATE and DELETE of audit_record (erasure deletes the payload row instead)."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION audit_record_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_record is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS audit_record_append_only ON audit_record;
CREATE TRIGGER audit_record_append_only BEFORE UPDATE OR DELETE ON audit_record
    FOR EACH ROW EXECUTE FUNCTION audit_record_append_only();
"""
DROP = """
DROP TRIGGER IF EXISTS audit_record_append_only ON audit_record;
DROP FUNCTION IF EXISTS audit_record_append_only();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
