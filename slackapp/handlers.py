"""What Slack's requests do, run by the Celery tasks once the view has verified and acknowledged
them (`slackapp.tasks`, which enter the tenant around each piece that reads or writes, and hold no
transaction while Slack answers). Nothing here trusts Slack for more than who clicked: a Slack
user acts only as the member they are linked to, through the same services (and the same rules)
as the dashboard; an unlinked user decides nothing and is told, privately, how to link.

Answers go back to the person who asked: an ephemeral message in the channel (button clicks) or
the command's response URL (slash commands).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from slack_sdk.webhook import WebhookClient

from core.actors import Actor
from core.errors import DomainError
from core.scoping import require_tenant
from fleet import services as fleet
from slackapp import blocks, crypto, decisions, services
from slackapp.blocks import obj
from slackapp.models import Installation
from tenants.actors import slack_actor
from tenants.models import Membership, Tenant

log = logging.getLogger(__name__)

NOTE_MAX = 1000
HALT_REASON_MAX = 500
HELP = (
    "Commands: `/saga-approve <request id> [note]`, `/saga-deny <request id> [note]`, "
    "`/saga-halt <scope> <reason>` (scope: `*`, `tool:<glob>`, `tag:<t>`, `agent:<name>`), `/saga-status`."
)


def _s(value: Any, limit: int = 64) -> str:
    return value if isinstance(value, str) and len(value) <= limit else ""


def actor_of(membership: Membership, slack_user_id: str) -> Actor:
    """A member acting from Slack: stored as the dashboard's person, so one person has one name
    in the evidence."""
    return slack_actor(membership.user.get_username(), slack_user_id)


def ephemeral(row: Installation | None, channel: str, user: str, text: str) -> None:
    """Answer `user` privately in `channel` with the installation's bot (no transaction open)."""
    if row is None or not channel or not user:
        return
    try:
        services.web_client(services.bot_token(row)).chat_postEphemeral(channel=channel, user=user, text=text)
    except (*services.UNREACHABLE, crypto.TokenUnreadable):
        log.warning("slack: could not answer %s in %s", user, channel, exc_info=True)


def _response_url_allowed(url: str) -> bool:
    """Slack's response URLs live on hooks.slack.com (or, in tests, on SLACK_API_URL's origin):
    the signed payload names it, and nothing else is ever posted to."""
    parts = urlsplit(url)
    api = urlsplit(settings.SLACK_API_URL)
    if parts.scheme == "https" and parts.hostname == "hooks.slack.com":
        return True
    return (parts.scheme, parts.netloc) == (api.scheme, api.netloc) and parts.path.startswith("/hooks/")


def respond(response_url: str, text: str) -> None:
    """Answer through a command's response URL (no transaction open)."""
    if not _response_url_allowed(response_url):
        log.warning("slack: response URL not on Slack's hooks host; answer dropped")
        return
    try:
        WebhookClient(response_url, timeout=services.API_TIMEOUT_S).send(text=text, response_type="ephemeral")
    except services.UNREACHABLE:
        log.warning("slack: could not answer through the response URL", exc_info=True)


def unlinked_text(tenant: Tenant, team: str, user: str) -> str:
    url = services.link_url(tenant, team, user)
    return (
        "Your Slack account is not linked to a Sagaplane member, so this decides nothing. "
        f"<{url}|Link it> (sign in and confirm; the link works for 15 minutes), then try again."
    )


# ------------------------------------------------------------------------------ button clicks


@dataclass(frozen=True)
class Click:
    """An approve or deny button clicked: on which request, by whom, in which workspace and channel."""

    action_id: str
    request_id: str
    user: str
    team: str
    channel: str


def click_of(payload: dict[str, Any]) -> Click | None:
    """The vote a block_actions payload asks for; None for anything else (the passkey button is a
    link: the browser does the work)."""
    if payload.get("type") != "block_actions":
        return None
    actions = payload.get("actions")
    action = obj(actions[0]) if isinstance(actions, list) and actions else {}
    action_id = action.get("action_id")
    if action_id not in (blocks.APPROVE, blocks.DENY):
        return None
    click = Click(
        action_id=str(action_id),
        request_id=_s(action.get("value"), 128),
        user=_s(obj(payload.get("user")).get("id")),
        team=_s(obj(payload.get("team")).get("id")),
        channel=_s(obj(payload.get("channel")).get("id")),
    )
    return click if click.request_id and click.user and click.team else None


def click_reply(tenant: Tenant, membership: Membership | None, click: Click) -> str:
    """The vote a click casts as the linked member, and what to tell the Slack user (an unlinked
    one: how to link). Inside the tenant."""
    require_tenant(tenant)
    if membership is None:
        return unlinked_text(tenant, click.team, click.user)
    return decisions.vote(
        tenant, membership, click.request_id, click.action_id, note="", actor=actor_of(membership, click.user)
    )


# ----------------------------------------------------------------------------- slash commands


COMMANDS = ("/saga-approve", "/saga-deny", "/saga-halt", "/saga-status")


@dataclass(frozen=True)
class Command:
    """A slash command: its name and text, who sent it from which workspace, where to answer."""

    name: str
    text: str
    team: str
    user: str
    response_url: str


def command_of(form: dict[str, Any]) -> Command:
    return Command(
        name=_s(form.get("command")),
        text=_s(form.get("text"), 4000).strip(),
        team=_s(form.get("team_id")),
        user=_s(form.get("user_id")),
        response_url=_s(form.get("response_url"), 1000),
    )


def command_reply(tenant: Tenant, membership: Membership | None, command: Command) -> str:
    """What the command does as the linked member, and the answer (an unlinked one: how to link).
    Inside the tenant."""
    require_tenant(tenant)
    name, text, slack_user = command.name, command.text, command.user
    if name not in COMMANDS:
        return f"Unknown command. {HELP}"
    if membership is None:
        return unlinked_text(tenant, command.team, slack_user)
    if name == "/saga-status":
        return decisions.status_text(tenant, membership)
    if name in ("/saga-approve", "/saga-deny"):
        request_id, _, note = text.partition(" ")
        if not request_id:
            return f"Which request? `{name} <request id> [note]`"
        choice = blocks.APPROVE if name == "/saga-approve" else blocks.DENY
        return decisions.vote(
            tenant,
            membership,
            request_id[:128],
            choice,
            note=note.strip()[:NOTE_MAX],
            actor=actor_of(membership, slack_user),
        )
    scope, _, reason = text.partition(" ")
    if not scope or not reason.strip():
        return "Usage: `/saga-halt <scope> <reason>`, e.g. `/saga-halt tool:stripe.* fraud`"
    if not membership.can("halt"):
        return f"Your role ({membership.role}) may not halt agents."
    try:
        with transaction.atomic():  # a refused halt leaves nothing behind in the caller's transaction
            halt = fleet.halt(
                tenant,
                fleet.HaltCreate.parse({"scope": scope, "reason": reason.strip()[:HALT_REASON_MAX]}),
                actor=actor_of(membership, slack_user),
            )
    except DomainError as exc:
        return f"Not halted: {exc.detail}"
    scope, reason = blocks.esc(halt.scope), blocks.esc(halt.reason)
    return f":octagonal_sign: Halted `{scope}` fleet-wide: {reason} (halt {halt.pk})."


# ------------------------------------------------------------------------------------- events


def forgets_team(event: dict[str, Any]) -> str:
    """Why Slack's event means the app left the workspace (then its installation is forgotten), or
    "" when it does not."""
    kind = event.get("type")
    if kind == "app_uninstalled":
        return "app-uninstalled"
    if kind == "tokens_revoked":
        bots = obj(event.get("tokens")).get("bot")
        # The bot's token is what an installation is: without it, nothing works.
        if isinstance(bots, list) and bots:
            return "tokens-revoked"
    return ""
