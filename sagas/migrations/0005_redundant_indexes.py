"""The projection's lone tenant and saga indexes go: each is the prefix of a composite index
(`saga_id_per_tenant`, `sagas_step_tool_saga`, `step_id_per_saga`). Only the indexes are dropped
(both databases name them alike); the foreign keys stay as they are -- Django's AlterField would
drop and re-add each constraint, re-validating every row under lock (minutes at 10M records)."""

import django.db.models.deletion
from django.db import migrations, models

from core.statistics import unindex_tenant


class Migration(migrations.Migration):
    dependencies = [
        ("sagas", "0004_list_keyset_indexes"),
        ("tenants", "0002_invitation_use"),
    ]

    operations = [
        unindex_tenant("saga", "sagas_saga", "sagas_saga_tenant_id_11ef2eb9"),
        unindex_tenant("step", "sagas_step", "sagas_step_tenant_id_4fd527ef"),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "sagas_step_saga_id_a0930111"',
                    reverse_sql='CREATE INDEX IF NOT EXISTS "sagas_step_saga_id_a0930111" ON "sagas_step" ("saga_id")',
                )
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="step",
                    name="saga",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="steps",
                        to="sagas.saga",
                    ),
                )
            ],
        ),
    ]
