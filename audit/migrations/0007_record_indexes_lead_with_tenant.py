# The seal pass reads a saga's records by (tenant, saga_id, leaf_index); no index on the tenant or
# the saga id alone (issue 16).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0006_record_indexes"),
        ("tenants", "0002_invitation_use"),
    ]

    operations = [
        migrations.AlterField(
            model_name="record",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                editable=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="tenants.tenant",
            ),
        ),
        migrations.RemoveIndex(model_name="record", name="audit_record_saga_id_3fdfa822"),
        migrations.AddIndex(
            model_name="record",
            index=models.Index(fields=["tenant", "saga_id", "leaf_index"], name="audit_record_saga"),
        ),
    ]
