"""Tree nodes: no lone tenant index (`one_tree_node_per_position` leads with the tenant): one index
write less per node, and no plan that reads a big tenant's every node through it when statistics
lag. Autovacuum analyzes the table after 2% of changes."""

from django.db import migrations

from core.statistics import analyze_sooner, unindex_tenant


class Migration(migrations.Migration):
    dependencies = [("transparency", "0003_seal_state"), ("tenants", "0002_invitation_use")]

    operations = [
        unindex_tenant("treenode", "transparency_treenode", "transparency_treenode_tenant_id_d5d1a313"),
        analyze_sooner("transparency_treenode"),
    ]
