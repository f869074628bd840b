"""The work behind Slack's requests and the channel's messages, in Celery: the views answer Slack
within its 3 seconds and queue these; the approvals hooks queue the posts and updates.

Each task is the transport that enters its tenant (`tenants.entry.tenant_task`, looked up only:
`transaction=False`), around each piece of work that reads or writes (`slackapp.decisions`,
`slackapp.handlers`, `slackapp.services`, which assert the scope) and never while it waits on
Slack: a transaction held across a Slack call would hold its locks and a pooled connection for
as long as Slack takes to answer."""

from __future__ import annotations

import http.client
import logging
from typing import Any

from celery import shared_task
from slack_sdk.errors import SlackRequestError

from core.scoping import tenant_context
from slackapp import decisions, handlers, selectors, services
from tenants.entry import tenant_task
from tenants.models import Membership, Tenant

log = logging.getLogger(__name__)


def _member(tenant: Tenant, team: str, slack_user: str) -> Membership | None:
    """The member a Slack user acts as: their link; else, where e-mail matching is on, the member
    whose e-mail Slack reports for them (asked between two transactions), then linked."""
    with tenant_context(tenant):
        found = services.member_for(tenant, team, slack_user)
    if not isinstance(found, services.EmailToMatch):
        return found
    slack_user_info = services.slack_user_of(found, slack_user)
    if slack_user_info is None:
        return None
    with tenant_context(tenant):
        return services.match_by_email(tenant, team, slack_user, slack_user_info)


@tenant_task(transaction=False)
def interaction(tenant: Tenant, payload: dict[str, Any]) -> None:
    """A button click: the vote as the linked member, answered privately in the channel."""
    click = handlers.click_of(payload)
    if click is None:
        return
    membership = _member(tenant, click.team, click.user)
    with tenant_context(tenant):
        text = handlers.click_reply(tenant, membership, click)
        row = selectors.installation()
    handlers.ephemeral(row, click.channel, click.user, text)


@tenant_task(transaction=False)
def command(tenant: Tenant, form: dict[str, Any]) -> None:
    """A slash command, done as the linked member, answered through its response URL."""
    asked = handlers.command_of(form)
    membership = _member(tenant, asked.team, asked.user) if asked.name in handlers.COMMANDS else None
    with tenant_context(tenant):
        reply = handlers.command_reply(tenant, membership, asked)
    if asked.response_url:
        handlers.respond(asked.response_url, reply)


@shared_task(name="slackapp.handle_interaction", ignore_result=True)
def handle_interaction(tenant_id: int, payload: dict[str, Any]) -> None:
    interaction(tenant_id, payload)
    services.prune_seen_signatures()


@shared_task(name="slackapp.handle_command", ignore_result=True)
def handle_command(tenant_id: int, form: dict[str, Any]) -> None:
    command(tenant_id, form)
    services.prune_seen_signatures()


@shared_task(name="slackapp.handle_event", ignore_result=True)
def handle_event(team_id: str, event: dict[str, Any]) -> None:
    """Slack says the app left a workspace: forget its installation, in the tenant that has it (a
    signed event names its team, not a tenant: the cross-tenant question finds it)."""
    why = handlers.forgets_team(event)
    tenant = selectors.tenant_of_team(team_id) if why else None
    if tenant is not None:
        with tenant_context(tenant):
            services.forget_team(tenant, team_id, why=why)
    services.prune_seen_signatures()


# Slack unreachable for a while: retried with backoff, then given up (the dashboard still shows
# it). Slack's own refusals (SlackApiError: a deleted channel, a revoked token) are not retried.
_RETRY: dict[str, Any] = {
    "autoretry_for": (SlackRequestError, OSError, http.client.HTTPException, decisions.NotPostedYet),
    "retry_backoff": 2,
    "retry_backoff_max": 60,
    "max_retries": 6,
}


@shared_task(name="slackapp.post_request", ignore_result=True, **_RETRY)
@tenant_task(transaction=False)
def post_request(tenant: Tenant, request_id: str) -> None:
    """Post the request's message once: the worker that claims it posts it (`core.claims`), records
    where only while its claim holds, and gives the claim back when the post fails."""
    with tenant_context(tenant):  # committed before the post: the claim holds while Slack answers
        claimed = decisions.claim_post(tenant, request_id)
    if claimed is None:
        return
    row, token = claimed
    try:
        with tenant_context(tenant):
            rendered = decisions.message(tenant, request_id)
        if rendered is None:
            raise LookupError(request_id)
        channel_id, ts = decisions.post(row, rendered)
    except Exception:
        with tenant_context(tenant):
            services.release_message_claim(tenant, request_id, token)
        raise
    with tenant_context(tenant):
        recorded = services.message_posted(tenant, request_id, token, channel_id=channel_id, ts=ts)
        # A decision that landed while this was posting re-renders it (its own update found no ts).
        now = decisions.message(tenant, request_id) if recorded else None
    if not recorded:
        log.warning("slack message of %s posted after its claim lapsed; another worker holds it", request_id)
        return
    if now is not None and now.decided:
        _refresh(tenant, request_id)


def _refresh(tenant: Tenant, request_id: str) -> None:
    with tenant_context(tenant):
        where = decisions.posted_message(tenant, request_id)
        rendered = decisions.message(tenant, request_id) if where is not None else None
    if where is None or rendered is None:
        return
    decisions.update(where, rendered)
    if rendered.decided:
        with tenant_context(tenant):
            services.finish_message(tenant, request_id)


@shared_task(name="slackapp.refresh_request", ignore_result=True, **_RETRY)
@tenant_task(transaction=False)
def refresh_request(tenant: Tenant, request_id: str) -> None:
    """Re-render the request's message as the request stands (votes, decision, no buttons)."""
    _refresh(tenant, request_id)


@shared_task(name="slackapp.notify_request", ignore_result=True, **_RETRY)
@tenant_task(transaction=False)
def notify_request(tenant: Tenant, request_id: str, kind: str, detail: dict[str, Any]) -> None:
    """A reply in the request's thread: who is asked now (escalation), or that time is running out."""
    with tenant_context(tenant):
        where = decisions.posted_message(tenant, request_id)
        text = decisions.reply_text(tenant, request_id, kind, detail) if where is not None else None
    if where is not None and text is not None:
        decisions.reply(where, text)
