"""The approvals hooks Slack listens to (subscribed in SlackappConfig.ready): each queues a
Celery task once the change has committed. The task is the transport that enters the tenant: it
finds whether the tenant's Slack has a channel (nothing to do without one) and reads the request
as it stands when it runs (`slackapp.tasks`). The hook itself reads nothing: it runs after the
commit, outside any tenant."""

from __future__ import annotations

from approvals import hooks
from slackapp import tasks


def on_approval_event(event: hooks.ApprovalEvent) -> None:
    request_id = str(event.request.get("id", ""))
    if event.kind == "created":
        tasks.post_request.delay(event.tenant.pk, request_id)
    elif event.kind in ("voted", "decided", "consumed"):
        tasks.refresh_request.delay(event.tenant.pk, request_id)
    elif event.kind in ("escalated", "warned"):
        tasks.notify_request.delay(event.tenant.pk, request_id, event.kind, dict(event.detail))


def subscribe() -> None:
    hooks.on_approval_event(on_approval_event)
