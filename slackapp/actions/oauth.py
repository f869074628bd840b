"""Installing the app (OAuth v2): the consent URL with a single-use state, and Slack's redirect
back, whose code is exchanged for the bot token (slack-sdk's flow)."""

from __future__ import annotations

import logging
import secrets
from datetime import UTC, datetime, timedelta
from logging import Logger
from typing import Any
from urllib.parse import urljoin

from django.conf import settings
from django.db import connection
from django.urls import reverse
from django.utils import timezone
from slack_sdk.errors import SlackApiError
from slack_sdk.oauth import AuthorizeUrlGenerator, OAuthStateStore
from slack_sdk.oauth.installation_store.models.installation import Installation as SlackInstallation

from core.actors import Actor
from core.scoping import require_tenant
from slackapp import selectors
from slackapp.actions.installations import DjangoInstallationStore
from slackapp.actions.web import UNREACHABLE, SlackError, configured, public_url, web_client
from slackapp.models import Installation, OAuthState
from tenants.models import Tenant

log = logging.getLogger(__name__)

BOT_SCOPES = (
    "chat:write",
    "chat:write.public",
    "commands",
    "channels:read",
    "users:read",
    "users:read.email",
)
STATE_TTL = timedelta(minutes=10)


def redirect_uri() -> str:
    return public_url(reverse("slack-oauth-callback"))


def authorize_url_generator() -> AuthorizeUrlGenerator:
    """slack-sdk's generator, its consent page on the same origin as the Web API."""
    return AuthorizeUrlGenerator(
        client_id=settings.SLACK_CLIENT_ID,
        redirect_uri=redirect_uri(),
        scopes=list(BOT_SCOPES),
        authorization_url=urljoin(settings.SLACK_API_URL, "/oauth/v2/authorize"),
    )


# ------------------------------------------------------------------------------ the OAuth state


class StateStore(OAuthStateStore):
    """slack-sdk's state store, in the database: a state is issued to one member of one tenant and
    consumed once, by one `DELETE ... RETURNING` (a read then a delete would let two callbacks with
    the same state both pass the read). Consuming an expired state deletes it and refuses it.
    Used inside the tenant (the page's)."""

    def __init__(self, tenant: Tenant, user: Any) -> None:
        self.tenant = tenant
        self.user = user

    @property
    def logger(self) -> Logger:
        return log

    def issue(self, *args: Any, **kwargs: Any) -> str:
        state = secrets.token_urlsafe(32)
        require_tenant(self.tenant)
        OAuthState.objects.filter(expires_at__lte=timezone.now()).delete()
        OAuthState.objects.create(state=state, user=self.user, expires_at=timezone.now() + STATE_TTL)
        return state

    def consume(self, state: str) -> bool:
        if not isinstance(state, str) or not 0 < len(state) <= 64:
            return False
        table = connection.ops.quote_name(OAuthState._meta.db_table)
        require_tenant(self.tenant)
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {table} WHERE state = %s AND tenant_id = %s AND user_id = %s "
                "RETURNING expires_at",
                [state, self.tenant.pk, self.user.pk],
            )
            row = cursor.fetchone()
        if row is None:
            return False
        expires_at = row[0]
        if isinstance(expires_at, str):  # SQLite hands RETURNING's timestamp back as text
            expires_at = datetime.fromisoformat(expires_at)
        if timezone.is_naive(expires_at):
            expires_at = timezone.make_aware(expires_at, UTC)
        return bool(expires_at > timezone.now())


def start_install(tenant: Tenant, user: Any) -> str:
    """The URL of Slack's consent page for this member, with a fresh single-use state. Inside the
    tenant."""
    if not configured():
        raise SlackError("not_configured", "SLACK_CLIENT_ID and SLACK_CLIENT_SECRET are not set", status=409)
    state = StateStore(tenant, user).issue()
    return authorize_url_generator().generate(state)


def claim_install(tenant: Tenant, user: Any, *, code: str, state: str) -> None:
    """Slack's redirect back, before the exchange: the state must be one this member was issued
    (consumed here, once) and Slack must have sent a code. Inside the tenant, committed before
    `exchange_code` waits on Slack (a refused exchange leaves the state spent, as a cancel does)."""
    require_tenant(tenant)
    if not configured():
        raise SlackError("not_configured", "SLACK_CLIENT_ID and SLACK_CLIENT_SECRET are not set", status=409)
    if not StateStore(tenant, user).consume(state):
        raise SlackError("invalid_state", "this install link is unknown, used or expired: start again")
    if not isinstance(code, str) or not 0 < len(code) <= 512:
        raise SlackError("invalid_code", "Slack sent no authorization code")


def exchange_code(code: str) -> SlackInstallation:
    """The code of a claimed install (`claim_install`) exchanged for the bot token
    (oauth.v2.access) and the token checked (auth.test), slack-sdk's flow. It waits on Slack:
    outside any transaction; `save_install` stores the answer."""
    client = web_client()
    try:
        answer = client.oauth_v2_access(
            client_id=settings.SLACK_CLIENT_ID,
            client_secret=settings.SLACK_CLIENT_SECRET,
            code=code,
            redirect_uri=redirect_uri(),
        )
        token = answer.get("access_token")
        if not token:
            raise SlackError("no_bot_token", "Slack granted no bot token")
        identity = client.auth_test(token=token)
    except SlackApiError as exc:
        raise SlackError(
            "slack_refused", f"Slack refused the install: {exc.response.get('error')}", status=502
        ) from None
    except UNREACHABLE:
        raise SlackError("slack_unreachable", "Slack could not be reached; try again", status=502) from None
    team = answer.get("team") or {}
    enterprise = answer.get("enterprise") or {}
    installation = SlackInstallation(
        app_id=answer.get("app_id"),
        enterprise_id=enterprise.get("id"),
        enterprise_name=enterprise.get("name"),
        team_id=team.get("id"),
        team_name=team.get("name"),
        bot_token=token,
        bot_id=identity.get("bot_id"),
        bot_user_id=answer.get("bot_user_id"),
        bot_scopes=answer.get("scope", ""),
        user_id=(answer.get("authed_user") or {}).get("id") or "",
        is_enterprise_install=bool(answer.get("is_enterprise_install")),
        token_type=answer.get("token_type"),
    )
    if not isinstance(installation.team_id, str) or not selectors.SLACK_ID.fullmatch(installation.team_id):
        raise SlackError("slack_refused", "Slack named no workspace", status=502)
    return installation


def save_install(tenant: Tenant, installation: SlackInstallation, *, actor: Actor) -> Installation:
    """Store what `exchange_code` got, the token encrypted (`DjangoInstallationStore`), recorded
    as `actor`. Inside the tenant."""
    require_tenant(tenant)
    DjangoInstallationStore(tenant, actor=actor).save(installation)
    return Installation.objects.get()
