# The lease uses' prune (fleet.actions.lease_settlement.prune_uses) reads a tenant's oldest uses.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0008_denial_source'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='leaseuse',
            index=models.Index(fields=['tenant', 'received_at'], name='fleet_lease_use_received'),
        ),
    ]
