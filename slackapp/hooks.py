"""The approvals hooks Slack listens to (subscribed in SlackappConfig.ready): each queues a
Celery task after the change commits, only for tenants whose Slack has a channel. The tasks read
the request as it stands when they run (`slackapp.decisions`)."""

from __future__ import annotations

from approvals import hooks
from core.scoping import tenant_context
from slackapp import tasks
from slackapp.models import Installation


def on_approval_event(event: hooks.ApprovalEvent) -> None:
    with tenant_context(event.tenant):
        if not Installation.objects.exclude(channel_id="").exists():
            return
    request_id = str(event.request.get("id", ""))
    if event.kind == "created":
        tasks.post_request.delay(event.tenant.pk, request_id)
    elif event.kind in ("voted", "decided", "consumed"):
        tasks.refresh_request.delay(event.tenant.pk, request_id)
    elif event.kind in ("escalated", "warned"):
        tasks.notify_request.delay(event.tenant.pk, request_id, event.kind, dict(event.detail))


def subscribe() -> None:
    hooks.on_approval_event(on_approval_event)
