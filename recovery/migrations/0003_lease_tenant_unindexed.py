"""Leases: no lone tenant index (`one_lease_per_saga` leads with the tenant). With statistics older
than a tenant's growth, ingest's lease lookup by saga ids read the tenant's every lease through it
(155 ms a batch at 10M records). Autovacuum analyzes the table after 2% of changes."""

from django.db import migrations

from core.statistics import analyze_sooner, unindex_tenant


class Migration(migrations.Migration):
    dependencies = [("recovery", "0002_run_frontier"), ("tenants", "0002_invitation_use")]

    operations = [
        unindex_tenant("lease", "recovery_lease", "recovery_lease_tenant_id_020cb52b"),
        analyze_sooner("recovery_lease"),
    ]
