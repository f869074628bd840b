"""The channel message of each approval request: claimed by the worker that posts it, then
finished once it shows the decision."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from slackapp.models import RequestMessage
from tenants.models import Tenant
from tenants.scoping import tenant_context


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


def message_posted(tenant: Tenant, request_id: str, *, channel_id: str, ts: str) -> None:
    """The claimed message is in the channel: where, so that updates and replies can find it."""
    with tenant_context(tenant):
        RequestMessage.objects.filter(request_id=request_id).update(channel_id=channel_id, ts=ts)


def release_message_claim(tenant: Tenant, request_id: str) -> None:
    """The post failed: give up the claim (only if nothing was posted), so another try may post."""
    with tenant_context(tenant):
        RequestMessage.objects.filter(request_id=request_id, ts="").delete()
