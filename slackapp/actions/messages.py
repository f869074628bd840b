"""The channel message of each approval request, posted as leased work (`core.claims`): the
worker that claims it posts it under a fencing token and a lease, records where it went only while
it still holds that token, and gives the claim back when the post fails; once it shows the
decision it is finished."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from core.claims import Leased, claim
from core.scoping import require_tenant
from slackapp.models import MessageState, RequestMessage
from tenants.models import Tenant

# Longer than a post takes (Slack's answer is awaited for at most API_TIMEOUT_S): a worker that
# died while posting leaves a claim that lapses after this, and another may post.
POST_LEASE = timedelta(seconds=30)

MESSAGES = Leased(
    RequestMessage,
    state="state",
    claimed=MessageState.POSTING,
    claimable=(MessageState.QUEUED, MessageState.POSTING),
    token="token",
    holder="holder",
    lease="lease_until",
)


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def claim_message_post(tenant: Tenant, request_id: str) -> int | None:
    """This worker's token for posting the request's message, or None when it is posted already
    or another worker holds a claim whose lease has not lapsed. Inside the tenant, whose transaction
    the caller commits before it posts (the claim must hold before Slack is asked)."""
    require_tenant(tenant)
    with transaction.atomic():  # the row and its claim, together
        row = RequestMessage(tenant=tenant, request_id=request_id, channel_id="", ts="")
        RequestMessage.objects.bulk_create([row], ignore_conflicts=True)

        def unposted(now: datetime) -> QuerySet[RequestMessage]:
            lapsed = Q(state=MessageState.POSTING, lease_until__lte=now)
            return RequestMessage.objects.filter(Q(state=MessageState.QUEUED) | lapsed, request_id=request_id)

        now = timezone.now()
        taken = claim(
            MESSAGES,
            lambda moment: unposted(moment).order_by("pk"),
            now=now,
            holder=_holder(),
            lease_until=now + POST_LEASE,
            limit=1,
            shape=(tenant.pk, request_id),
        )
    return taken[0].token if taken else None


def is_posted(tenant: Tenant, request_id: str) -> bool:
    """Whether the request's message is in the channel."""
    require_tenant(tenant)
    return RequestMessage.objects.filter(request_id=request_id, state=MessageState.POSTED).exists()


def _held(request_id: str, token: int) -> RequestMessage | None:
    row = RequestMessage.objects.select_for_update().filter(request_id=request_id).first()
    return row if row is not None and MESSAGES.holds(row, token) else None


def message_posted(tenant: Tenant, request_id: str, token: int, *, channel_id: str, ts: str) -> bool:
    """The claimed message is in the channel: where, so that updates and replies can find it.
    False (nothing recorded) when `token` no longer holds the claim: its lease lapsed and another
    worker claimed the message."""
    require_tenant(tenant)
    row = _held(request_id, token)
    if row is None:
        return False
    row.state, row.channel_id, row.ts = MessageState.POSTED, channel_id, ts
    row.save(update_fields=["state", "channel_id", "ts"])
    return True


def release_message_claim(tenant: Tenant, request_id: str, token: int) -> None:
    """The post failed: give the claim back (while `token` still holds it), so another try may
    post at once."""
    require_tenant(tenant)
    row = _held(request_id, token)
    if row is not None:
        row.state = MessageState.QUEUED  # claimable at once, whatever its lease said
        row.save(update_fields=["state"])


def finish_message(tenant: Tenant, request_id: str) -> RequestMessage | None:
    """Mark the request's message as updated to its decision; None when there is none to update
    or it is finished already (so it is updated once)."""
    require_tenant(tenant)
    row = RequestMessage.objects.select_for_update().filter(request_id=request_id).first()
    if row is None or row.finished or row.state != MessageState.POSTED:
        return None
    row.finished = True
    row.save(update_fields=["finished"])
    return row
