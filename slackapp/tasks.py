"""The work behind Slack's requests and the channel's messages, in Celery: the views answer Slack
within its 3 seconds and queue these; the approvals hooks queue the posts and updates."""

from __future__ import annotations

import http.client
import logging
from typing import Any

from celery import shared_task
from slack_sdk.errors import SlackRequestError

from slackapp import decisions, handlers, services
from tenants.entry import tenant_by_id, tenant_task
from tenants.models import Tenant

log = logging.getLogger(__name__)


def _tenant(tenant_id: int) -> Tenant | None:
    return tenant_by_id(tenant_id)


@shared_task(name="slackapp.handle_interaction", ignore_result=True)
def handle_interaction(tenant_id: int, payload: dict[str, Any]) -> None:
    tenant = _tenant(tenant_id)
    if tenant is not None:
        handlers.interaction(tenant, payload)
    services.prune_seen_signatures()


@shared_task(name="slackapp.handle_command", ignore_result=True)
def handle_command(tenant_id: int, form: dict[str, Any]) -> None:
    tenant = _tenant(tenant_id)
    if tenant is not None:
        handlers.command(tenant, form)
    services.prune_seen_signatures()


@shared_task(name="slackapp.handle_event", ignore_result=True)
def handle_event(team_id: str, event: dict[str, Any]) -> None:
    handlers.event(team_id, event)
    services.prune_seen_signatures()


# Slack unreachable for a while: retried with backoff, then given up (the dashboard still shows
# it). Slack's own refusals (SlackApiError: a deleted channel, a revoked token) are not retried.
_RETRY: dict[str, Any] = {
    "autoretry_for": (SlackRequestError, OSError, http.client.HTTPException, decisions.NotPostedYet),
    "retry_backoff": 2,
    "retry_backoff_max": 60,
    "max_retries": 6,
}


# Each waits on Slack between its transactions: the tenant is looked up, not entered.
@shared_task(name="slackapp.post_request", ignore_result=True, **_RETRY)
@tenant_task(transaction=False)
def post_request(tenant: Tenant, request_id: str) -> None:
    decisions.post_request(tenant, request_id)


@shared_task(name="slackapp.refresh_request", ignore_result=True, **_RETRY)
@tenant_task(transaction=False)
def refresh_request(tenant: Tenant, request_id: str) -> None:
    decisions.refresh_request(tenant, request_id)


@shared_task(name="slackapp.notify_request", ignore_result=True, **_RETRY)
@tenant_task(transaction=False)
def notify_request(tenant: Tenant, request_id: str, kind: str, detail: dict[str, Any]) -> None:
    decisions.notify(tenant, request_id, kind, detail)
