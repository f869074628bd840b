# Posting a request's channel message becomes leased work (core.claims): a state, a fencing token,
# a holder and a lease, instead of "whoever inserted the row first" (issue 25, step 4).

import datetime

from django.db import migrations, models
from django.db.models import F

# A claim taken before this migration is honoured as long as a new claim's lease would be.
_LEASE = datetime.timedelta(seconds=30)


def states_of_existing(apps, schema_editor):
    # Runs as the owner (row-level security does not bind it); the base manager, not the tenant
    # manager, so no tenant needs to be active.
    RequestMessage = apps.get_model("slackapp", "RequestMessage")
    RequestMessage._base_manager.exclude(ts="").update(state="posted")
    RequestMessage._base_manager.filter(ts="").update(
        state="posting", token=1, lease_until=F("posted_at") + _LEASE
    )


class Migration(migrations.Migration):

    dependencies = [
        ('slackapp', '0001_slack_installations_links_messages'),
    ]

    operations = [
        migrations.AddField(
            model_name='requestmessage',
            name='holder',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddField(
            model_name='requestmessage',
            name='lease_until',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='requestmessage',
            name='state',
            field=models.CharField(
                choices=[
                    ('queued', 'To post (nobody is posting it)'),
                    ('posting', 'Claimed by a worker that is posting it, until its lease lapses'),
                    ('posted', 'In the channel (channel_id and ts say where)'),
                ],
                default='queued',
                max_length=8,
            ),
        ),
        migrations.AddField(
            model_name='requestmessage',
            name='token',
            field=models.BigIntegerField(default=0),
        ),
        migrations.RunPython(states_of_existing, migrations.RunPython.noop),
    ]
