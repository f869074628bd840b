"""The tenant's installation: slack-sdk's installation store (the token encrypted), uninstall, the
channel requests go to and e-mail matching.

Each change takes a keyword-only `actor` and appends its record (old and new values, never a
token) to the tenant's server stream in the same transaction."""

from __future__ import annotations

import logging
from logging import Logger
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from sagaplane.events import Event
from slack_sdk.oauth import InstallationStore
from slack_sdk.oauth.installation_store.models.bot import Bot
from slack_sdk.oauth.installation_store.models.installation import Installation as SlackInstallation

from core.actionaudit import append_server_record
from core.actors import Actor
from core.scoping import require_tenant
from slackapp import crypto
from slackapp.actions.web import UNREACHABLE, SlackError, bot_token, configured, web_client
from slackapp.models import Installation, UserLink
from tenants.actors import system_actor
from tenants.models import Tenant

log = logging.getLogger(__name__)


def installation_values(row: Installation) -> dict[str, Any]:
    """An installation as audit records show it (never the token)."""
    return {
        "team_id": row.team_id,
        "team_name": row.team_name,
        "enterprise_id": row.enterprise_id or None,
        "app_id": row.app_id,
        "bot_user_id": row.bot_user_id,
        "bot_scopes": list(row.bot_scopes),
        "channel_id": row.channel_id or None,
        "email_matching": row.email_matching,
    }


class DjangoInstallationStore(InstallationStore):
    """slack-sdk's installation store for one tenant: bot installations only, one workspace per
    tenant, the token encrypted (`slackapp.crypto`). Writes are audited as `actor`."""

    def __init__(self, tenant: Tenant, *, actor: Actor) -> None:
        self.tenant = tenant
        self.actor = actor

    @property
    def logger(self) -> Logger:
        return log

    def save(self, installation: SlackInstallation) -> None:
        if not installation.bot_token or not installation.team_id:
            raise SlackError("no_bot_token", "Slack granted no bot token for a workspace")
        require_tenant(self.tenant)
        # Its own savepoint: a workspace another tenant has is refused after the old one's rows
        # were deleted, and the refusal must bring them back whatever the caller's block commits.
        with transaction.atomic():
            row = Installation.objects.select_for_update().first()
            old = installation_values(row) if row is not None else None
            if row is not None and row.team_id != installation.team_id:
                UserLink.objects.all().delete()  # links belong to the workspace being replaced
                row.delete()
                row = None
            if row is None:
                row = Installation(tenant=self.tenant, team_id=installation.team_id)
            row.team_name = installation.team_name or ""
            row.enterprise_id = installation.enterprise_id or ""
            row.app_id = installation.app_id or ""
            row.bot_id = installation.bot_id or ""
            row.bot_user_id = installation.bot_user_id or ""
            row.bot_scopes = list(installation.bot_scopes or [])
            row.encrypted_bot_token = crypto.encrypt_token(
                installation.bot_token, tenant_id=self.tenant.pk, team_id=installation.team_id
            )
            row.installer_slack_user_id = installation.user_id or ""
            row.installed_by = str(self.actor)
            row.installed_at = timezone.now()
            try:
                with transaction.atomic():
                    row.save()
            except IntegrityError:
                raise SlackError(
                    "workspace_taken",
                    "this Slack workspace is connected to another Sagaplane tenant",
                    status=409,
                ) from None
            append_server_record(
                self.tenant,
                Event.SLACK_INSTALLED,
                {"team_id": row.team_id, "old": old, "new": installation_values(row)},
                actor=self.actor,
            )

    def save_bot(self, bot: Bot) -> None:
        raise NotImplementedError("installations are saved whole (save)")

    def _row(self, team_id: str | None) -> Installation | None:
        require_tenant(self.tenant)
        row = Installation.objects.first()
        return row if row is not None and (team_id is None or row.team_id == team_id) else None

    def find_bot(
        self, *, enterprise_id: str | None, team_id: str | None, is_enterprise_install: bool | None = False
    ) -> Bot | None:
        installation = self.find_installation(enterprise_id=enterprise_id, team_id=team_id)
        return installation.to_bot() if installation is not None else None

    def find_installation(
        self,
        *,
        enterprise_id: str | None,
        team_id: str | None,
        user_id: str | None = None,
        is_enterprise_install: bool | None = False,
    ) -> SlackInstallation | None:
        row = self._row(team_id)
        if row is None:
            return None
        return SlackInstallation(
            app_id=row.app_id,
            enterprise_id=row.enterprise_id or None,
            team_id=row.team_id,
            team_name=row.team_name,
            bot_token=bot_token(row),
            bot_id=row.bot_id,
            bot_user_id=row.bot_user_id,
            bot_scopes=list(row.bot_scopes),
            user_id=row.installer_slack_user_id,
            installed_at=row.installed_at.timestamp(),
        )

    def delete_bot(self, *, enterprise_id: str | None, team_id: str | None) -> None:
        self.delete_installation(enterprise_id=enterprise_id, team_id=team_id)

    def delete_installation(
        self, *, enterprise_id: str | None, team_id: str | None, user_id: str | None = None
    ) -> None:
        require_tenant(self.tenant)
        with transaction.atomic():  # the installation, its links and the record, together
            row = Installation.objects.select_for_update().first()
            if row is None or (team_id is not None and row.team_id != team_id):
                return  # already gone: a no-op records nothing
            old = installation_values(row)
            links = UserLink.objects.filter(team_id=row.team_id).count()
            UserLink.objects.filter(team_id=row.team_id).delete()
            row.delete()
            append_server_record(
                self.tenant,
                Event.SLACK_UNINSTALLED,
                {"team_id": old["team_id"], "old": {**old, "linked_users": links}, "new": None},
                actor=self.actor,
            )

    def delete_all(self, *, enterprise_id: str | None, team_id: str | None) -> None:
        self.delete_installation(enterprise_id=enterprise_id, team_id=team_id)


def revoke_app(row: Installation) -> None:
    """Remove the app from the installation's workspace (apps.uninstall), best effort: the
    installation is forgotten all the same (`uninstall`). It waits on Slack: outside any
    transaction, with the row read in the tenant before."""
    if not configured():
        return
    try:
        web_client(bot_token(row)).apps_uninstall(
            client_id=settings.SLACK_CLIENT_ID, client_secret=settings.SLACK_CLIENT_SECRET
        )
    except (*UNREACHABLE, crypto.TokenUnreadable):
        log.warning(
            "slack: apps.uninstall failed for tenant %s; forgetting it anyway", row.tenant_id, exc_info=True
        )


def uninstall(tenant: Tenant, team_id: str, *, actor: Actor) -> bool:
    """Forget the installation of this workspace and its links (the owner's, after `revoke_app`;
    Slack's app_uninstalled and tokens_revoked, in the tenant `selectors.tenant_of_team` found).
    False when it had none. Inside the tenant."""
    require_tenant(tenant)
    if not Installation.objects.filter(team_id=team_id).exists():
        return False
    DjangoInstallationStore(tenant, actor=actor).delete_all(enterprise_id=None, team_id=team_id)
    return True


def forget_team(tenant: Tenant, team_id: str, *, why: str) -> bool:
    """Slack says the app is gone from a workspace (app_uninstalled, tokens_revoked): `uninstall`,
    recorded as Slack's. False when the tenant had no installation of it."""
    return uninstall(tenant, team_id, actor=system_actor(f"slack-{why}"))


def list_channels(row: Installation) -> list[dict[str, str]]:
    """The installation's workspace's public channels the bot can post in, as [{id, name}]
    (conversations.list). It waits on Slack: outside any transaction, with the row read in the
    tenant before."""
    channels: list[dict[str, str]] = []
    cursor = None
    try:
        for _ in range(20):  # at most 20 pages of 200
            page = web_client(bot_token(row)).conversations_list(
                exclude_archived=True, types="public_channel", limit=200, cursor=cursor
            )
            found: list[dict[str, Any]] = page.get("channels") or []
            channels += [{"id": str(c["id"]), "name": str(c.get("name", c["id"]))} for c in found]
            cursor = (page.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                break
    except (*UNREACHABLE, crypto.TokenUnreadable) as exc:
        raise SlackError(
            "slack_unreachable", f"could not list the workspace's channels ({type(exc).__name__})", status=502
        ) from None
    return sorted(channels, key=lambda c: c["name"])


def set_channel(
    tenant: Tenant, channel_id: Any, channels: list[dict[str, str]], *, team_id: str, actor: Actor
) -> Installation:
    """Where approval requests are posted: one of `channels`, the workspace `team_id`'s as
    `list_channels` found them (asked before, outside the transaction), chosen by an owner.
    Inside the tenant."""
    names = {c["id"]: c["name"] for c in channels}
    if not isinstance(channel_id, str) or channel_id not in names:
        raise SlackError("invalid_channel", "choose one of the workspace's channels")
    require_tenant(tenant)
    with transaction.atomic():  # the channel and its record, together
        row = Installation.objects.select_for_update().first()
        if row is None:
            raise SlackError("not_installed", "Slack is not installed for this tenant", status=404)
        if row.team_id != team_id:  # replaced by another workspace while its channels were asked
            raise SlackError(
                "invalid_channel", "the workspace changed: choose one of its channels", status=409
            )
        old = {"channel_id": row.channel_id or None, "channel_name": row.channel_name or None}
        if row.channel_id == channel_id:
            return row
        row.channel_id, row.channel_name = channel_id, names[channel_id]
        row.save(update_fields=["channel_id", "channel_name"])
        append_server_record(
            tenant,
            Event.SLACK_CHANNEL_CHANGED,
            {
                "team_id": row.team_id,
                "old": old,
                "new": {"channel_id": channel_id, "channel_name": row.channel_name},
            },
            actor=actor,
        )
    return row


def set_email_matching(tenant: Tenant, enabled: bool, *, actor: Actor) -> None:
    """Whether a Slack user whose verified e-mail is a member's acts as that member unlinked."""
    require_tenant(tenant)
    with transaction.atomic():  # the setting and its record, together
        row = Installation.objects.select_for_update().first()
        if row is None:
            raise SlackError("not_installed", "Slack is not installed for this tenant", status=404)
        if row.email_matching == enabled:
            return
        row.email_matching = enabled
        row.save(update_fields=["email_matching"])
        append_server_record(
            tenant,
            Event.SLACK_EMAIL_MATCHING_CHANGED,
            {
                "team_id": row.team_id,
                "old": {"email_matching": not enabled},
                "new": {"email_matching": enabled},
            },
            actor=actor,
        )
