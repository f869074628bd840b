"""Postgres re-plans a growing tenant's projection from fresh statistics sooner: autovacuum
analyzes these tables after 2% of their rows changed instead of 10% (its default). The fold reads
a batch's sagas and steps by id; with statistics from before a tenant's growth the planner took the
tenant for a few hundred rows and scanned all of its steps through `sagas_step_tool_saga` instead
(docs/SCALING.md: 86 ms a batch instead of 3 at 2M records). Nothing on SQLite."""

from django.db import migrations

from core.statistics import analyze_sooner


class Migration(migrations.Migration):
    dependencies = [("sagas", "0005_redundant_indexes")]

    operations = [analyze_sooner("sagas_saga", "sagas_step")]
