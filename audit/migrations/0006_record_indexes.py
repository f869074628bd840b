"""Record indexes that ingest can keep up with at any log size (docs/SCALING.md, "Ingest at size").

- `audit_record_hash` (tenant, h) becomes (leaf_block, tenant, h): `h` is random, so every insert
  went to a random page of an index that outgrew memory; keyed by the block of 2**16 leaves first
  (`leaf_block`, a stored generated column: `leaf_index >> 16`), a tenant's inserts touch only its
  newest block's pages. Adding the column rewrites `audit_record` once (Postgres holds an
  exclusive lock meanwhile: ingest waits; about a minute per few million records). A partial
  (tenant, h) index on position 1 serves agent-saga's attach of a new chain.
- `saga_id` keeps its plain btree (same name, not rebuilt) and loses the `_like`
  (varchar_pattern_ops) copy Postgres got from `db_index=True`: no query runs LIKE on it, and
  every insert paid for it.
"""

from django.db import migrations, models

import audit.models

SAGA_INDEX = "audit_record_saga_id_3fdfa822"


def drop_like(apps, schema_editor):
    # Only Postgres has the `_like` copy; elsewhere db_index=True made the plain index alone.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f'DROP INDEX IF EXISTS "{SAGA_INDEX}_like"', params=None)


def restore_like(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS "{SAGA_INDEX}_like" ON "audit_record" ("saga_id" varchar_pattern_ops)',
            params=None,
        )


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0005_pending_server_record"),
        ("tenants", "0002_invitation_use"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="record", name="audit_record_hash"),
        migrations.AddField(
            model_name="record",
            name="leaf_block",
            field=models.GeneratedField(
                db_persist=True,
                expression=audit.models.LeafBlock("leaf_index"),
                output_field=models.BigIntegerField(),
            ),
        ),
        migrations.AddIndex(
            model_name="record",
            index=models.Index(fields=["leaf_block", "tenant", "h"], name="audit_record_hash_in_block"),
        ),
        migrations.AddIndex(
            model_name="record",
            index=models.Index(
                condition=models.Q(("position", 1)), fields=["tenant", "h"], name="audit_record_first_hash"
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="record",
                    name="saga_id",
                    field=models.CharField(blank=True, default="", max_length=128),
                ),
                migrations.AddIndex(
                    model_name="record", index=models.Index(fields=["saga_id"], name=SAGA_INDEX)
                ),
            ],
            database_operations=[migrations.RunPython(drop_like, restore_like)],
        ),
    ]
