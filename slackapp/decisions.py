"""Approvals in Slack: votes from a click or a command, and the channel message of each request.

A vote from Slack is `approvals.services.vote` with the linked member, the same call the
dashboard makes: eligibility, the requester excluded, one vote per member, passkey-only policies
(which refuse it: a Slack click is no passkey) are all decided there, not here.

Each pending request gets one message in the tenant's channel (posted by whichever worker claims
the request first); a vote, a decision or the effect starting re-renders it from the request as
it stands, so a late or repeated update never shows an older state; decided, it names who decided
and has no buttons. Escalation and the expiry warning are replies in the message's thread,
mentioning the linked Slack users they concern.
"""

from __future__ import annotations

import logging
from typing import Any

from approvals import selectors as approval_selectors
from approvals import services as approvals
from approvals.models import Status, VoteChoice
from core.actors import Actor, shown_name
from core.errors import DomainError
from core.scoping import tenant_context
from fleet import services as fleet
from slackapp import blocks, selectors, services
from slackapp.models import Installation, MessageState
from tenants.models import Membership, Tenant

log = logging.getLogger(__name__)


class NotPostedYet(Exception):
    """The request's message is being posted by another worker: retry shortly."""


def _page(request_id: str) -> str:
    return services.public_url(blocks.request_page(request_id))


# ------------------------------------------------------------------------------------- votes


def vote(
    tenant: Tenant, membership: Membership, request_id: str, choice: str, *, note: str, actor: Actor
) -> str:
    """Vote as `membership`; the sentence to show the Slack user (privately)."""
    try:
        with tenant_context(tenant):  # the vote's transaction; the answer to Slack waits outside it
            row = approvals.vote(tenant, request_id, membership, choice, note, actor=actor)
    except DomainError as exc:
        if exc.code == "passkey_required":
            return (
                "Nothing decided: this request's policy takes passkey votes only, and a Slack click is "
                f"no passkey. <{_page(request_id)}|Approve with passkey> in the browser."
            )
        return f"Nothing decided: {exc.detail}."
    if row.status == Status.PENDING:
        return f"Your {choice} is counted: {row.approvals} of {row.required} approvals so far."
    outcome = "approved" if row.status == Status.APPROVED else str(row.status)
    return f"Your {choice} is counted: the request is {outcome}."


def status_text(tenant: Tenant, membership: Membership) -> str:
    """What `/saga-status` answers: the halts in force and the requests waiting for votes."""
    with tenant_context(tenant):
        halts = fleet.halts_in_force()
        pending = approval_selectors.requests(Status.PENDING, limit=20)
        yours = [r for r in pending if approvals.eligible(r, membership)]
    lines = [f"*{blocks.esc(tenant.name)}*"]
    if halts:
        lines.append("Halts in force:")
        lines += [
            f"• `{blocks.esc(h.scope)}` ({h.mode}): {blocks.esc(h.reason)} — {blocks.esc(h.actor)}"
            for h in halts
        ]
    else:
        lines.append("No halt in force.")
    lines.append(
        f"Approval requests waiting: {len(pending)}" + (f", {len(yours)} for you:" if yours else ".")
    )
    lines += [
        f"• `{blocks.esc(r.pk)}` `{blocks.esc(r.tool)}` ({r.approvals} of {r.required}) <{_page(r.pk)}|open>"
        for r in yours
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the channel


def _installation(tenant: Tenant) -> Installation | None:
    with tenant_context(tenant):
        row = selectors.installation()
    return row if row is not None and row.channel_id else None


def _request(tenant: Tenant, request_id: str) -> tuple[dict[str, Any], list[str]] | None:
    """The request as it stands (its JSON) and who decided it (mentions of linked Slack users)."""
    with tenant_context(tenant):
        row = approval_selectors.request(request_id)
        if row is None:
            return None
        values = approvals.request_values(row)
        deciders: list[str] = []
        if row.status != Status.PENDING and row.status != Status.EXPIRED:
            wanted = VoteChoice.DENY if row.status == Status.DENIED else VoteChoice.APPROVE
            votes = approval_selectors.votes(row, choice=wanted)
            links = selectors.slack_ids_of([v.user_id for v in votes])
            for v in votes:
                name = blocks.esc(shown_name(v.voter))
                deciders.append(f"<@{links[v.user_id]}> ({name})" if v.user_id in links else name)
            if not deciders and row.decided_by:
                deciders.append(blocks.esc(shown_name(row.decided_by)))
    return values, deciders


def _render(values: dict[str, Any], deciders: list[str]) -> tuple[str, list]:
    page = _page(str(values["id"]))
    if values.get("status") == Status.PENDING:
        return blocks.pending(values, page)
    return blocks.decided(values, page, deciders)


def post_request(tenant: Tenant, request_id: str) -> None:
    """Post the request's message once: the worker that claims it posts it (`core.claims`). While
    another worker's claim holds, this one waits for it (NotPostedYet, retried): should that worker
    die, its lease lapses and a retry here claims the message and posts it."""
    row = _installation(tenant)
    if row is None:
        return
    token = services.claim_message_post(tenant, request_id)
    if token is None:
        if services.is_posted(tenant, request_id):
            return
        raise NotPostedYet(request_id)
    try:
        found = _request(tenant, request_id)
        if found is None:
            raise LookupError(request_id)
        text, body = _render(*found)
        answer = services.web_client(services.bot_token(row)).chat_postMessage(
            channel=row.channel_id, text=text, blocks=body, unfurl_links=False, unfurl_media=False
        )
    except Exception:
        services.release_message_claim(tenant, request_id, token)
        raise
    channel_id = str(answer.get("channel") or row.channel_id)
    if not services.message_posted(tenant, request_id, token, channel_id=channel_id, ts=str(answer["ts"])):
        log.warning("slack message of %s posted after its claim lapsed; another worker holds it", request_id)
        return
    # A decision that landed while this was posting re-renders it (its own update found no ts).
    found = _request(tenant, request_id)
    if found is not None and found[0].get("status") != Status.PENDING:
        refresh_request(tenant, request_id)


def refresh_request(tenant: Tenant, request_id: str) -> None:
    """Re-render the request's message as the request stands (votes, decision, no buttons)."""
    row = _installation(tenant)
    if row is None:
        return
    with tenant_context(tenant):
        message = selectors.message_of(request_id)
    if message is None or message.state == MessageState.QUEUED:
        return  # never posted (Slack installed later, or the post failed: its retry renders anew)
    if message.state != MessageState.POSTED:
        raise NotPostedYet(request_id)
    found = _request(tenant, request_id)
    if found is None:
        return
    text, body = _render(*found)
    services.web_client(services.bot_token(row)).chat_update(
        channel=message.channel_id, ts=message.ts, text=text, blocks=body
    )
    if found[0].get("status") != Status.PENDING:
        services.finish_message(tenant, request_id)


def _mentions(tenant: Tenant, roles: list[str], members: list[int]) -> tuple[list[str], int]:
    """Mentions of the linked Slack users among the members with these roles or ids, and how many
    such members have no Slack link."""
    with tenant_context(tenant):
        people = list(Membership.objects.filter(role__in=roles).values_list("user_id", flat=True))
        people += [m for m in members if m not in people]
        links = selectors.slack_ids_of(people)
    return [f"<@{links[p]}>" for p in people if p in links], sum(1 for p in people if p not in links)


def notify(tenant: Tenant, request_id: str, kind: str, detail: dict[str, Any]) -> None:
    """A reply in the request's thread: who is asked now (escalation), or that time is running out."""
    row = _installation(tenant)
    if row is None:
        return
    with tenant_context(tenant):
        message = selectors.message_of(request_id)
    if message is None or message.state == MessageState.QUEUED:
        return
    if message.state != MessageState.POSTED:
        raise NotPostedYet(request_id)
    page = _page(request_id)
    if kind == "escalated":
        roles = [str(r) for r in detail.get("roles", []) if isinstance(r, str)]
        members = [int(m) for m in detail.get("members", []) if isinstance(m, int)]
        mentions, unlinked = _mentions(tenant, roles, members)
        who = " ".join(mentions) or "the next approvers"
        level = int(detail.get("level", 0))
        text = f":arrow_up: Escalated (level {level}): {who}, please <{page}|review this request>."
        if unlinked:
            text += f" ({unlinked} of them have no linked Slack account and were not mentioned.)"
    elif kind == "warned":
        minutes = max(1, round(float(detail.get("expires_in") or 0) / 60))
        text = (
            f":hourglass_flowing_sand: This request expires in about {minutes} min with "
            f"{int(detail.get('approvals', 0))} of {int(detail.get('required', 1))} approvals; "
            "then it is denied."
        )
    else:
        return
    services.web_client(services.bot_token(row)).chat_postMessage(
        channel=message.channel_id, thread_ts=message.ts, text=text, unfurl_links=False
    )
