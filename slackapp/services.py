"""Every state change of the Slack context: install (OAuth v2), channel, e-mail matching,
uninstall, account links, and the verification of Slack's requests.

Each change takes a keyword-only `actor` and appends its record (old and new values, never a
token) to the tenant's server stream in the same transaction. Slack's Web API is reached only
through `web_client`, whose base URL is `SLACK_API_URL`: the same code talks to Slack and to the
tests' local server.
"""

from __future__ import annotations

import http.client
import logging
import secrets
import time
from datetime import UTC, datetime, timedelta
from logging import Logger
from typing import Any
from urllib.parse import urljoin

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.db import IntegrityError, connection, transaction
from django.urls import reverse
from django.utils import timezone
from sagaplane.events import Event
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler
from slack_sdk.oauth import AuthorizeUrlGenerator, InstallationStore, OAuthStateStore
from slack_sdk.oauth.installation_store.models.bot import Bot
from slack_sdk.oauth.installation_store.models.installation import Installation as SlackInstallation
from slack_sdk.signature import SignatureVerifier

from audit.services import append_server_record
from controlplane.errors import DomainError
from controlplane.numbers import ascii_int
from slackapp import crypto, selectors
from slackapp.models import Installation, OAuthState, RequestMessage, SeenSignature, UserLink
from tenants.actors import system_actor
from tenants.models import Membership, Tenant
from tenants.scoping import tenant_context

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
LINK_TTL_S = 15 * 60
SIGNATURE_WINDOW_S = 5 * 60
API_TIMEOUT_S = 10
# What a call to Slack can raise: Slack's own refusals and the SDK's errors, and the network's
# (WebClient lets connection errors and timeouts through as they are).
UNREACHABLE = (SlackClientError, OSError, http.client.HTTPException)


class SlackError(DomainError):
    """A refused Slack action, with a machine-readable code and a sentence a person can act on."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(status, code, detail)


def configured() -> bool:
    """Whether the app's credentials are set (install needs the client id and secret)."""
    return bool(settings.SLACK_CLIENT_ID and settings.SLACK_CLIENT_SECRET)


def web_client(token: str | None = None) -> WebClient:
    """Slack's Web API (or the local server the tests start), with a bounded wait; a rate-limited
    call waits as Slack's Retry-After says, twice at most (a connection error is retried once,
    slack-sdk's default)."""
    client = WebClient(token=token, base_url=settings.SLACK_API_URL, timeout=API_TIMEOUT_S)
    client.retry_handlers.append(RateLimitErrorRetryHandler(max_retry_count=2))
    return client


def public_url(path: str) -> str:
    return urljoin(settings.SAGAPLANE_PUBLIC_URL.rstrip("/") + "/", path.lstrip("/"))


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
    the same state both pass the read). Consuming an expired state deletes it and refuses it."""

    def __init__(self, tenant: Tenant, user: Any) -> None:
        self.tenant = tenant
        self.user = user

    @property
    def logger(self) -> Logger:
        return log

    def issue(self, *args: Any, **kwargs: Any) -> str:
        state = secrets.token_urlsafe(32)
        with tenant_context(self.tenant):
            OAuthState.objects.filter(expires_at__lte=timezone.now()).delete()
            OAuthState.objects.create(state=state, user=self.user, expires_at=timezone.now() + STATE_TTL)
        return state

    def consume(self, state: str) -> bool:
        if not isinstance(state, str) or not 0 < len(state) <= 64:
            return False
        table = connection.ops.quote_name(OAuthState._meta.db_table)
        with tenant_context(self.tenant), connection.cursor() as cursor:
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


# --------------------------------------------------------------------------- the installations


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

    def __init__(self, tenant: Tenant, *, actor: str) -> None:
        self.tenant = tenant
        self.actor = actor

    @property
    def logger(self) -> Logger:
        return log

    def save(self, installation: SlackInstallation) -> None:
        if not installation.bot_token or not installation.team_id:
            raise SlackError(400, "no_bot_token", "Slack granted no bot token for a workspace")
        with tenant_context(self.tenant):
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
            row.installed_by = self.actor
            row.installed_at = timezone.now()
            try:
                with transaction.atomic():
                    row.save()
            except IntegrityError:
                raise SlackError(
                    409, "workspace_taken", "this Slack workspace is connected to another Sagaplane tenant"
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
        with tenant_context(self.tenant):
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
        with tenant_context(self.tenant):
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


def bot_token(row: Installation) -> str:
    return crypto.decrypt_token(row.encrypted_bot_token, tenant_id=row.tenant_id, team_id=row.team_id)


def start_install(tenant: Tenant, user: Any) -> str:
    """The URL of Slack's consent page for this member, with a fresh single-use state."""
    if not configured():
        raise SlackError(409, "not_configured", "SLACK_CLIENT_ID and SLACK_CLIENT_SECRET are not set")
    state = StateStore(tenant, user).issue()
    return authorize_url_generator().generate(state)


def finish_install(tenant: Tenant, user: Any, *, code: str, state: str, actor: str) -> Installation:
    """Slack's redirect back: the state must be one this member was issued (consumed here, once),
    then the code is exchanged for the bot token (oauth.v2.access), checked (auth.test) and stored
    encrypted (slack-sdk's flow, with `DjangoInstallationStore`)."""
    if not configured():
        raise SlackError(409, "not_configured", "SLACK_CLIENT_ID and SLACK_CLIENT_SECRET are not set")
    if not StateStore(tenant, user).consume(state):
        raise SlackError(400, "invalid_state", "this install link is unknown, used or expired: start again")
    if not isinstance(code, str) or not 0 < len(code) <= 512:
        raise SlackError(400, "invalid_code", "Slack sent no authorization code")
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
            raise SlackError(400, "no_bot_token", "Slack granted no bot token")
        identity = client.auth_test(token=token)
    except SlackApiError as exc:
        raise SlackError(
            502, "slack_refused", f"Slack refused the install: {exc.response.get('error')}"
        ) from None
    except UNREACHABLE:
        raise SlackError(502, "slack_unreachable", "Slack could not be reached; try again") from None
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
        raise SlackError(502, "slack_refused", "Slack named no workspace")
    DjangoInstallationStore(tenant, actor=actor).save(installation)
    with tenant_context(tenant):
        row = Installation.objects.get()
    return row


def uninstall(tenant: Tenant, *, actor: str) -> bool:
    """Remove the app from the workspace (apps.uninstall, best effort) and forget the installation
    and its links. False when there was none."""
    with tenant_context(tenant):
        row = Installation.objects.first()
    if row is None:
        return False
    if configured():
        try:
            web_client(bot_token(row)).apps_uninstall(
                client_id=settings.SLACK_CLIENT_ID, client_secret=settings.SLACK_CLIENT_SECRET
            )
        except (*UNREACHABLE, crypto.TokenUnreadable):
            log.warning(
                "slack: apps.uninstall failed for tenant %s; forgetting it anyway", tenant.pk, exc_info=True
            )
    DjangoInstallationStore(tenant, actor=actor).delete_all(enterprise_id=None, team_id=row.team_id)
    return True


def forget_team(team_id: str, *, why: str) -> bool:
    """Slack says the app is gone from a workspace (app_uninstalled, tokens_revoked): delete its
    installation, wherever it is. False when no tenant had it."""
    tenant = selectors.tenant_of_team(team_id)
    if tenant is None:
        return False
    DjangoInstallationStore(tenant, actor=system_actor(f"slack-{why}")).delete_all(
        enterprise_id=None, team_id=team_id
    )
    return True


def list_channels(tenant: Tenant) -> list[dict[str, str]]:
    """The workspace's public channels the bot can post in, as [{id, name}] (conversations.list)."""
    with tenant_context(tenant):
        row = Installation.objects.first()
    if row is None:
        return []
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
            502, "slack_unreachable", f"could not list the workspace's channels ({type(exc).__name__})"
        ) from None
    return sorted(channels, key=lambda c: c["name"])


def set_channel(tenant: Tenant, channel_id: Any, *, actor: str) -> Installation:
    """Where approval requests are posted: one of the workspace's channels, chosen by an owner."""
    channels = {c["id"]: c["name"] for c in list_channels(tenant)}
    if not isinstance(channel_id, str) or channel_id not in channels:
        raise SlackError(400, "invalid_channel", "choose one of the workspace's channels")
    with tenant_context(tenant):
        row = Installation.objects.select_for_update().first()
        if row is None:
            raise SlackError(404, "not_installed", "Slack is not installed for this tenant")
        old = {"channel_id": row.channel_id or None, "channel_name": row.channel_name or None}
        if row.channel_id == channel_id:
            return row
        row.channel_id, row.channel_name = channel_id, channels[channel_id]
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


def set_email_matching(tenant: Tenant, enabled: bool, *, actor: str) -> None:
    """Whether a Slack user whose verified e-mail is a member's acts as that member unlinked."""
    with tenant_context(tenant):
        row = Installation.objects.select_for_update().first()
        if row is None:
            raise SlackError(404, "not_installed", "Slack is not installed for this tenant")
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


# ---------------------------------------------------------------------------------- the links

_LINK_SALT = "slackapp.link"


def link_token(tenant: Tenant, team_id: str, slack_user_id: str) -> str:
    """A signed, expiring invitation for this Slack user to link themselves to a member (sent to
    them alone, in an ephemeral message)."""
    return signing.dumps(
        {"t": tenant.pk, "team": team_id, "user": slack_user_id}, salt=_LINK_SALT, compress=True
    )


def read_link_token(token: str) -> tuple[int, str, str]:
    """(tenant id, team id, Slack user id) of a link token, or SlackError when forged or expired."""
    try:
        data = signing.loads(token, salt=_LINK_SALT, max_age=LINK_TTL_S)
    except signing.SignatureExpired:
        raise SlackError(410, "link_expired", "this link has expired: ask Slack for a new one") from None
    except signing.BadSignature:
        raise SlackError(404, "invalid_link", "this link is not one Sagaplane made") from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("t"), int)
        or not isinstance(data.get("team"), str)
        or not isinstance(data.get("user"), str)
    ):
        raise SlackError(404, "invalid_link", "this link is not one Sagaplane made")
    return data["t"], data["team"], data["user"]


def link_url(tenant: Tenant, team_id: str, slack_user_id: str) -> str:
    return public_url(reverse("slack-link", args=[link_token(tenant, team_id, slack_user_id)]))


def link_user(
    tenant: Tenant, user: Any, *, team_id: str, slack_user_id: str, how: str, actor: str
) -> UserLink:
    """Link a Slack user of the tenant's workspace to this member (replacing the member's earlier
    link; a Slack user already linked to someone else must be unlinked first)."""
    with tenant_context(tenant):
        row = Installation.objects.first()
        if row is None or row.team_id != team_id:
            raise SlackError(
                409, "not_installed", "this Slack workspace is no longer connected to the tenant"
            )
        if not Membership.objects.filter(user=user).exists():
            raise SlackError(404, "not_a_member", "only a member of the tenant can be linked")
        taken = UserLink.objects.filter(team_id=team_id, slack_user_id=slack_user_id).first()
        if taken is not None and taken.user_id == user.pk:
            return taken
        if taken is not None:
            raise SlackError(409, "slack_user_taken", "this Slack user is linked to another member")
        previous = UserLink.objects.filter(user=user).first()
        old = None
        if previous is not None:
            old = {"team_id": previous.team_id, "slack_user_id": previous.slack_user_id}
            previous.delete()
        link = UserLink.objects.create(team_id=team_id, slack_user_id=slack_user_id, user=user, how=how)
        append_server_record(
            tenant,
            Event.SLACK_USER_LINKED,
            {
                "member": user.get_username(),
                "old": old,
                "new": {"team_id": team_id, "slack_user_id": slack_user_id, "how": how},
            },
            actor=actor,
        )
    return link


def unlink_user(tenant: Tenant, user: Any, *, actor: str) -> bool:
    with tenant_context(tenant):
        link = UserLink.objects.filter(user=user).first()
        if link is None:
            return False
        old = {"team_id": link.team_id, "slack_user_id": link.slack_user_id, "how": link.how}
        link.delete()
        append_server_record(
            tenant,
            Event.SLACK_USER_UNLINKED,
            {"member": user.get_username(), "old": old, "new": None},
            actor=actor,
        )
    return True


def member_for(tenant: Tenant, team_id: str, slack_user_id: str) -> Membership | None:
    """The membership a Slack user acts through in this tenant: their explicit link, else (only
    where the owner turned e-mail matching on) the member whose e-mail Slack reports for them,
    which is then recorded as a link. None: unlinked."""
    with tenant_context(tenant):
        row = Installation.objects.first()
        if row is None or row.team_id != team_id:
            return None
        user_id = selectors.linked_user_id(team_id, slack_user_id)
        if user_id is not None:
            return Membership.objects.select_related("user").filter(user_id=user_id).first()
        if not row.email_matching:
            return None
    try:
        info = web_client(bot_token(row)).users_info(user=slack_user_id)
    except (*UNREACHABLE, crypto.TokenUnreadable):
        log.warning("slack: users.info failed for %s", slack_user_id, exc_info=True)
        return None
    user = info.get("user") or {}
    profile = user.get("profile") or {}
    email = profile.get("email")
    # Slack reports an e-mail only once the workspace has confirmed it; bots and guests never match.
    if not isinstance(email, str) or "@" not in email or user.get("is_bot") or user.get("is_restricted"):
        return None
    with tenant_context(tenant):
        membership = (
            Membership.objects.select_related("user").filter(user__email__iexact=email).order_by("pk").first()
        )
        if membership is None:
            return None
        try:
            with transaction.atomic():
                link_user(
                    tenant,
                    membership.user,
                    team_id=team_id,
                    slack_user_id=slack_user_id,
                    how="email",
                    actor=system_actor(f"slack-email-match:{slack_user_id}"),
                )
        except SlackError:
            return None  # the member is linked to someone else already: the explicit link wins
    return membership


# ------------------------------------------------------------------- verifying Slack's requests


class RequestRefused(SlackError):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(401, code, detail)


def verify_request(body: bytes, headers: Any) -> None:
    """Slack's `X-Slack-Signature` over the raw body and `X-Slack-Request-Timestamp`, within five
    minutes of now (slack-sdk's SignatureVerifier), then refused if this signature was seen before
    (its row is written here and committed, so a replay racing the first is refused too)."""
    secret = settings.SLACK_SIGNING_SECRET
    if not secret:
        raise RequestRefused("not_configured", "SLACK_SIGNING_SECRET is not set: no request can be verified")
    timestamp = headers.get("X-Slack-Request-Timestamp")
    signature = headers.get("X-Slack-Signature")
    if not timestamp or not signature:
        raise RequestRefused("unsigned", "the request carries no Slack signature")
    if ascii_int(timestamp, max_digits=12) is None or len(signature) > 80:
        raise RequestRefused("bad_signature", "the Slack signature is malformed")
    try:
        body.decode("utf-8")  # Slack signs text; anything else is not its request
    except UnicodeDecodeError:
        raise RequestRefused("bad_signature", "the Slack signature does not match the body") from None
    if abs(time.time() - int(timestamp)) > SIGNATURE_WINDOW_S:
        raise RequestRefused("stale_request", "the request's timestamp is more than five minutes away")
    if not SignatureVerifier(secret).is_valid(body=body, timestamp=timestamp, signature=signature):
        raise RequestRefused("bad_signature", "the Slack signature does not match the body")
    expires = datetime.fromtimestamp(int(timestamp) + SIGNATURE_WINDOW_S + 60, tz=UTC)
    try:
        with transaction.atomic():
            SeenSignature.objects.create(signature=signature, expires_at=expires)
    except IntegrityError:
        raise RequestRefused("replayed", "this signed request was received before") from None


def prune_seen_signatures(now: datetime | None = None) -> int:
    """Forget signatures whose timestamp can no longer pass the window (cheap, indexed)."""
    deleted, _ = SeenSignature.objects.filter(expires_at__lt=now or timezone.now()).delete()
    return deleted


# ------------------------------------------------------------------------ the channel messages


def message_for(request_id: str) -> RequestMessage | None:
    return RequestMessage.objects.filter(request_id=request_id).first()


def remember_message(tenant: Tenant, request_id: str, *, channel_id: str, ts: str) -> RequestMessage:
    with tenant_context(tenant):
        row, _ = RequestMessage.objects.get_or_create(
            request_id=request_id, defaults={"channel_id": channel_id, "ts": ts}
        )
    return row


def claim_message_post(tenant: Tenant, request_id: str) -> bool:
    """Whether this worker is the one to post the request's message (the first to claim it)."""
    with tenant_context(tenant):
        try:
            with transaction.atomic():
                RequestMessage.objects.create(request_id=request_id, channel_id="", ts="")
        except IntegrityError:
            return False
    return True


def finish_message(tenant: Tenant, request_id: str) -> RequestMessage | None:
    """Mark the request's message as updated to its decision; None when there is none to update
    or it is finished already (so it is updated once)."""
    with tenant_context(tenant):
        row = RequestMessage.objects.select_for_update().filter(request_id=request_id).first()
        if row is None or row.finished or not row.ts:
            return None
        row.finished = True
        row.save(update_fields=["finished"])
    return row


User = get_user_model()
