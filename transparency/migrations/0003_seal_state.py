# The seal watermark moves from TreeState to a row of its own (SealState), so seal passes lock
# that row and no longer wait for the integrator's TreeState lock (issue 16).

import django.db.models.deletion
from django.db import migrations, models


def copy_watermarks(apps, schema_editor):
    # Runs as the owner (row-level security does not bind it); the base manager, not the tenant
    # manager, so no tenant needs to be active.
    TreeState = apps.get_model("transparency", "TreeState")
    SealState = apps.get_model("transparency", "SealState")
    SealState._base_manager.bulk_create(
        SealState(tenant_id=tenant_id, sealed_size=sealed_size)
        for tenant_id, sealed_size in TreeState._base_manager.values_list("tenant_id", "sealed_size")
    )


def copy_back(apps, schema_editor):
    TreeState = apps.get_model("transparency", "TreeState")
    SealState = apps.get_model("transparency", "SealState")
    for tenant_id, sealed_size in SealState._base_manager.values_list("tenant_id", "sealed_size"):
        TreeState._base_manager.filter(tenant_id=tenant_id).update(sealed_size=sealed_size)


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0002_invitation_use'),
        ('transparency', '0002_export_recovery_seal_watermark'),
    ]

    operations = [
        migrations.CreateModel(
            name='SealState',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('sealed_size', models.BigIntegerField(default=0)),
                (
                    'tenant',
                    models.ForeignKey(
                        editable=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name='+',
                        to='tenants.tenant',
                    ),
                ),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('tenant',), name='one_seal_state_per_tenant')],
            },
        ),
        migrations.RunPython(copy_watermarks, copy_back),
        migrations.RemoveField(model_name='treestate', name='sealed_size'),
    ]
