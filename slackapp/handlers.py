"""What Slack's requests do, run by the Celery tasks once the view has verified and acknowledged
them (`slackapp.tasks`). Nothing here trusts Slack for more than who clicked: a Slack user acts
only as the member they are linked to, through the same services (and the same rules) as the
dashboard; an unlinked user decides nothing and is told, privately, how to link.

Answers go back to the person who asked: an ephemeral message in the channel (button clicks) or
the command's response URL (slash commands).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from slack_sdk.webhook import WebhookClient

from core.actors import Actor
from core.errors import DomainError
from core.scoping import tenant_context
from fleet import services as fleet
from slackapp import blocks, crypto, decisions, selectors, services
from slackapp.blocks import obj
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


def _ephemeral(tenant: Tenant, channel: str, user: str, text: str) -> None:
    with tenant_context(tenant):
        row = selectors.installation()
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


def _respond(response_url: str, text: str) -> None:
    if not _response_url_allowed(response_url):
        log.warning("slack: response URL not on Slack's hooks host; answer dropped")
        return
    try:
        WebhookClient(response_url, timeout=services.API_TIMEOUT_S).send(text=text, response_type="ephemeral")
    except services.UNREACHABLE:
        log.warning("slack: could not answer through the response URL", exc_info=True)


def _unlinked_text(tenant: Tenant, team: str, user: str) -> str:
    url = services.link_url(tenant, team, user)
    return (
        "Your Slack account is not linked to a Sagaplane member, so this decides nothing. "
        f"<{url}|Link it> (sign in and confirm; the link works for 15 minutes), then try again."
    )


# ------------------------------------------------------------------------------ button clicks


def interaction(tenant: Tenant, payload: dict[str, Any]) -> None:
    if payload.get("type") != "block_actions":
        return
    actions = payload.get("actions")
    action = obj(actions[0]) if isinstance(actions, list) and actions else {}
    action_id = action.get("action_id")
    if action_id not in (blocks.APPROVE, blocks.DENY):
        return  # the passkey button is a link: the browser does the work
    request_id = _s(action.get("value"), 128)
    slack_user = _s(obj(payload.get("user")).get("id"))
    team = _s(obj(payload.get("team")).get("id"))
    channel = _s(obj(payload.get("channel")).get("id"))
    if not request_id or not slack_user or not team:
        return
    membership = services.member_for(tenant, team, slack_user)
    if membership is None:
        _ephemeral(tenant, channel, slack_user, _unlinked_text(tenant, team, slack_user))
        return
    text = decisions.vote(
        tenant, membership, request_id, action_id, note="", actor=actor_of(membership, slack_user)
    )
    _ephemeral(tenant, channel, slack_user, text)


# ----------------------------------------------------------------------------- slash commands


def command(tenant: Tenant, form: dict[str, Any]) -> None:
    name = _s(form.get("command"))
    text = _s(form.get("text"), 4000)
    team, slack_user = _s(form.get("team_id")), _s(form.get("user_id"))
    response_url = _s(form.get("response_url"), 1000)
    reply = command_reply(tenant, name, text.strip(), team, slack_user)
    if response_url:
        _respond(response_url, reply)


def command_reply(tenant: Tenant, name: str, text: str, team: str, slack_user: str) -> str:
    if name not in ("/saga-approve", "/saga-deny", "/saga-halt", "/saga-status"):
        return f"Unknown command. {HELP}"
    membership = services.member_for(tenant, team, slack_user)
    if membership is None:
        return _unlinked_text(tenant, team, slack_user)
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


def event(team_id: str, event: dict[str, Any]) -> bool:
    """Slack says the app left a workspace: forget its installation. True when one was deleted."""
    kind = event.get("type")
    if kind == "app_uninstalled":
        return services.forget_team(team_id, why="app-uninstalled")
    if kind == "tokens_revoked":
        bots = obj(event.get("tokens")).get("bot")
        if (
            isinstance(bots, list) and bots
        ):  # the bot's token is what an installation is: without it, nothing works
            return services.forget_team(team_id, why="tokens-revoked")
    return False
