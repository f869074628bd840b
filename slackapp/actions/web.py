"""Slack's Web API, reached only through `web_client`, whose base URL is `SLACK_API_URL`: the same
code talks to Slack and to the tests' local server. And the error every Slack action refuses with."""

from __future__ import annotations

import http.client
from urllib.parse import urljoin

from django.conf import settings
from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

from core.errors import DomainError
from slackapp import crypto
from slackapp.models import Installation

API_TIMEOUT_S = 10
# What a call to Slack can raise: Slack's own refusals and the SDK's errors, and the network's
# (WebClient lets connection errors and timeouts through as they are).
UNREACHABLE = (SlackClientError, OSError, http.client.HTTPException)


class SlackError(DomainError):
    """A refused Slack action, with a machine-readable code and a sentence a person can act on
    (a kind of its own: the link flow catches Slack's refusals apart from the others)."""


def configured() -> bool:
    """Whether the app's credentials are set (install needs the client id and secret)."""
    return bool(settings.SLACK_CLIENT_ID and settings.SLACK_CLIENT_SECRET)


def web_client(token: str | None = None) -> WebClient:
    """Slack's Web API (or the local server the tests start), with a bounded wait; a rate-limited
    call waits as Slack's Retry-After says, twice at most (a connection error is retried once,
    slack-sdk's default)."""
    client = WebClient(token=token, base_url=settings.SLACK_API_URL, timeout=API_TIMEOUT_S)
    client.retry_handlers.append(RateLimitErrorRetryHandler(max_retry_count=2))
    return client


def public_url(path: str) -> str:
    return urljoin(settings.SAGAPLANE_PUBLIC_URL.rstrip("/") + "/", path.lstrip("/"))


def bot_token(row: Installation) -> str:
    return crypto.decrypt_token(row.encrypted_bot_token, tenant_id=row.tenant_id, team_id=row.team_id)
