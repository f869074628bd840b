"""Approvals in Slack: votes from a click or a command, and the channel message of each request.

A vote from Slack is `approvals.services.vote` with the linked member, the same call the
dashboard makes: eligibility, the requester excluded, one vote per member, passkey-only policies
(which refuse it: a Slack click is no passkey) are all decided there, not here.

Each pending request gets one message in the tenant's channel (posted by whichever worker claims
the request first); a vote, a decision or the effect starting re-renders it from the request as
it stands, so a late or repeated update never shows an older state; decided, it names who decided
and has no buttons. Escalation and the expiry warning are replies in the message's thread,
mentioning the linked Slack users they concern.

Every function here that reads or writes runs inside the tenant, which its Celery task entered
(`slackapp.tasks`); the functions that talk to Slack take what they need and touch no database,
so the tasks hold no transaction while Slack answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from approvals import selectors as approval_selectors
from approvals import services as approvals
from approvals.models import Status, VoteChoice
from core.actors import Actor, shown_name
from core.errors import DomainError
from core.scoping import require_tenant
from fleet import services as fleet
from slackapp import blocks, selectors, services
from slackapp.models import Installation, MessageState
from tenants.models import Membership, Tenant


class NotPostedYet(Exception):
    """The request's message is being posted by another worker: retry shortly."""


def _page(request_id: str) -> str:
    return services.public_url(blocks.request_page(request_id))


# ------------------------------------------------------------------------------------- votes


def vote(
    tenant: Tenant, membership: Membership, request_id: str, choice: str, *, note: str, actor: Actor
) -> str:
    """Vote as `membership`; the sentence to show the Slack user (privately). Inside the tenant."""
    require_tenant(tenant)
    try:
        with transaction.atomic():  # a refused vote leaves nothing behind in the caller's transaction
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
    """What `/saga-status` answers: the halts in force and the requests waiting for votes. Inside
    the tenant."""
    require_tenant(tenant)
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


@dataclass(frozen=True)
class Message:
    """A request's message as it stands, rendered: its text, its blocks and whether it is decided."""

    text: str
    blocks: list
    decided: bool


@dataclass(frozen=True)
class Posted:
    """Where a request's message is: the installation that posts it, and its channel and ts
    (None: not to be updated, never posted or already finished)."""

    installation: Installation
    channel_id: str
    ts: str


def _installation() -> Installation | None:
    row = selectors.installation()
    return row if row is not None and row.channel_id else None


def _request(request_id: str) -> tuple[dict[str, Any], list[str]] | None:
    """The request as it stands (its JSON) and who decided it (mentions of linked Slack users)."""
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


def message(tenant: Tenant, request_id: str) -> Message | None:
    """The request's message rendered as the request stands (None: no such request). Inside the
    tenant."""
    require_tenant(tenant)
    found = _request(request_id)
    if found is None:
        return None
    values, deciders = found
    page = _page(str(values["id"]))
    if values.get("status") == Status.PENDING:
        return Message(*blocks.pending(values, page), decided=False)
    return Message(*blocks.decided(values, page, deciders), decided=True)


def claim_post(tenant: Tenant, request_id: str) -> tuple[Installation, int] | None:
    """The installation to post the request's message with and this worker's claim on posting it
    (`core.claims`); None when there is nothing to post (no channel, or posted already). While
    another worker's claim holds, NotPostedYet (the task retries): should that worker die, its
    lease lapses and a retry claims the message. Inside the tenant, committed before the post."""
    require_tenant(tenant)
    row = _installation()
    if row is None:
        return None
    token = services.claim_message_post(tenant, request_id)
    if token is None:
        if services.is_posted(tenant, request_id):
            return None
        raise NotPostedYet(request_id)
    return row, token


def post(row: Installation, rendered: Message) -> tuple[str, str]:
    """Post a request's message in the tenant's channel (Slack's answer is awaited: no transaction
    may be open); its channel and ts."""
    answer = services.web_client(services.bot_token(row)).chat_postMessage(
        channel=row.channel_id,
        text=rendered.text,
        blocks=rendered.blocks,
        unfurl_links=False,
        unfurl_media=False,
    )
    return str(answer.get("channel") or row.channel_id), str(answer["ts"])


def posted_message(tenant: Tenant, request_id: str) -> Posted | None:
    """Where the request's message is, to update or reply to; None when there is none (Slack
    installed later, or the post failed: its retry renders anew). NotPostedYet while another
    worker is posting it. Inside the tenant."""
    require_tenant(tenant)
    row = _installation()
    if row is None:
        return None
    found = selectors.message_of(request_id)
    if found is None or found.state == MessageState.QUEUED:
        return None
    if found.state != MessageState.POSTED:
        raise NotPostedYet(request_id)
    return Posted(row, found.channel_id, found.ts)


def update(where: Posted, rendered: Message) -> None:
    """Re-render the posted message (Slack's answer is awaited: no transaction may be open)."""
    services.web_client(services.bot_token(where.installation)).chat_update(
        channel=where.channel_id, ts=where.ts, text=rendered.text, blocks=rendered.blocks
    )


def _mentions(roles: list[str], members: list[int]) -> tuple[list[str], int]:
    """Mentions of the linked Slack users among the members with these roles or ids, and how many
    such members have no Slack link."""
    people = list(Membership.objects.filter(role__in=roles).values_list("user_id", flat=True))
    people += [m for m in members if m not in people]
    links = selectors.slack_ids_of(people)
    return [f"<@{links[p]}>" for p in people if p in links], sum(1 for p in people if p not in links)


def reply_text(tenant: Tenant, request_id: str, kind: str, detail: dict[str, Any]) -> str | None:
    """The reply in the request's thread: who is asked now (escalation), or that time is running
    out; None for any other kind. Inside the tenant."""
    require_tenant(tenant)
    page = _page(request_id)
    if kind == "escalated":
        roles = [str(r) for r in detail.get("roles", []) if isinstance(r, str)]
        members = [int(m) for m in detail.get("members", []) if isinstance(m, int)]
        mentions, unlinked = _mentions(roles, members)
        who = " ".join(mentions) or "the next approvers"
        level = int(detail.get("level", 0))
        text = f":arrow_up: Escalated (level {level}): {who}, please <{page}|review this request>."
        if unlinked:
            text += f" ({unlinked} of them have no linked Slack account and were not mentioned.)"
        return text
    if kind == "warned":
        minutes = max(1, round(float(detail.get("expires_in") or 0) / 60))
        return (
            f":hourglass_flowing_sand: This request expires in about {minutes} min with "
            f"{int(detail.get('approvals', 0))} of {int(detail.get('required', 1))} approvals; "
            "then it is denied."
        )
    return None


def reply(where: Posted, text: str) -> None:
    """A reply in the message's thread (Slack's answer is awaited: no transaction may be open)."""
    services.web_client(services.bot_token(where.installation)).chat_postMessage(
        channel=where.channel_id, thread_ts=where.ts, text=text, unfurl_links=False
    )
