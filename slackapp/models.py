"""Slack: one workspace per tenant, the people linked to members, the messages posted per request.

Invariants (kept by `slackapp.services`, the only writer):
- a workspace (team id) is installed for at most one tenant, and a tenant has at most one
  installation: a signed request from Slack names its team, and that names one tenant;
- the bot token is stored encrypted (`slackapp.crypto`, AES-GCM bound to the tenant and team),
  never in the clear;
- an OAuth `state` is single-use and short-lived: the callback consumes it with one
  `DELETE ... RETURNING` (whoever deletes the row owns it), so a reused or forged state installs
  nothing;
- a Slack user is linked to at most one member of the tenant and a member to at most one Slack
  user, only by an explicit confirmation (or, where the owner turned it on, by e-mail);
- a request's channel message is posted by the one worker holding its claim (a fencing token
  and a lease, `core.claims`): a worker that died while posting leaves a lease that lapses, and
  a late one whose claim was taken again records nothing;
- a seen request signature is kept until the signed timestamp can no longer pass the 5-minute
  window, so the same signed request is never acted on twice.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from core.scoping import TenantScopedModel


class Installation(TenantScopedModel):
    """The tenant's Slack workspace: who installed it, its bot, and the channel requests go to."""

    team_id = models.CharField(max_length=32, unique=True)
    team_name = models.CharField(max_length=200, blank=True)
    enterprise_id = models.CharField(max_length=32, blank=True)
    app_id = models.CharField(max_length=32, blank=True)
    bot_id = models.CharField(max_length=32, blank=True)
    bot_user_id = models.CharField(max_length=32, blank=True)
    bot_scopes = models.JSONField(default=list)
    encrypted_bot_token = models.TextField()  # slackapp.crypto; never the token itself
    installer_slack_user_id = models.CharField(max_length=32, blank=True)
    installed_by = models.CharField(max_length=200)  # the actor, user:<name>
    installed_at = models.DateTimeField(default=timezone.now)
    channel_id = models.CharField(max_length=32, blank=True)
    channel_name = models.CharField(max_length=200, blank=True)
    email_matching = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant"], name="one_slack_installation_per_tenant")]

    def __str__(self) -> str:
        return f"{self.team_name or self.team_id}"


class OAuthState(TenantScopedModel):
    """An install in progress: the `state` sent to Slack, whose member asked, until when it holds."""

    state = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    expires_at = models.DateTimeField()


SLACK_NAME_MAX = 200


class UserLink(TenantScopedModel):
    """A Slack user of the tenant's workspace acting as one member."""

    team_id = models.CharField(max_length=32)
    slack_user_id = models.CharField(max_length=32)
    # The name Slack showed for the user when they linked (users.info): for people reading the
    # Slack page, never for deciding anything; "" when Slack could not be asked.
    slack_name = models.CharField(max_length=SLACK_NAME_MAX, blank=True, default="")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    how = models.CharField(max_length=16)  # "confirmed" (the link page) or "email"
    linked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "team_id", "slack_user_id"], name="one_member_per_slack_user"
            ),
            models.UniqueConstraint(fields=["tenant", "user"], name="one_slack_user_per_member"),
        ]


class MessageState(models.TextChoices):
    QUEUED = "queued", "To post (nobody is posting it)"
    POSTING = "posting", "Claimed by a worker that is posting it, until its lease lapses"
    POSTED = "posted", "In the channel (channel_id and ts say where)"


class RequestMessage(TenantScopedModel):
    """The channel message that shows one approval request (updated when it is decided). Posting
    it is leased work (`core.claims`): a worker claims it under a new `token` until
    `lease_until`, and only the holder of the current token records where it was posted."""

    request_id = models.CharField(max_length=128)
    state = models.CharField(max_length=8, choices=MessageState.choices, default=MessageState.QUEUED)
    token = models.BigIntegerField(default=0)  # fencing token: +1 on every claim
    holder = models.CharField(max_length=200, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    channel_id = models.CharField(max_length=32)
    ts = models.CharField(max_length=32)
    posted_at = models.DateTimeField(default=timezone.now)
    finished = models.BooleanField(default=False)  # updated to its decision: no buttons left

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "request_id"], name="one_message_per_request")
        ]


class SeenSignature(models.Model):
    """A verified Slack request signature, until its timestamp is out of the window (not a tenant
    table: a replay is refused before anyone reads which tenant it is for)."""

    signature = models.CharField(max_length=80, unique=True)
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return self.signature
