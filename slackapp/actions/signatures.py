"""Verifying Slack's requests: the signature, the five-minute window, and no replay."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from slack_sdk.signature import SignatureVerifier

from core.numbers import ascii_int
from slackapp.actions.web import SlackError
from slackapp.models import SeenSignature

SIGNATURE_WINDOW_S = 5 * 60


def verify_request(body: bytes, headers: Any) -> None:
    """Slack's `X-Slack-Signature` over the raw body and `X-Slack-Request-Timestamp`, within five
    minutes of now (slack-sdk's SignatureVerifier), then refused if this signature was seen before
    (its row is written here and committed, so a replay racing the first is refused too)."""
    secret = settings.SLACK_SIGNING_SECRET
    if not secret:
        raise SlackError(
            "not_configured", "SLACK_SIGNING_SECRET is not set: no request can be verified", status=401
        )
    timestamp = headers.get("X-Slack-Request-Timestamp")
    signature = headers.get("X-Slack-Signature")
    if not timestamp or not signature:
        raise SlackError("unsigned", "the request carries no Slack signature", status=401)
    if ascii_int(timestamp, max_digits=12) is None or len(signature) > 80:
        raise SlackError("bad_signature", "the Slack signature is malformed", status=401)
    try:
        body.decode("utf-8")  # Slack signs text; anything else is not its request
    except UnicodeDecodeError:
        raise SlackError("bad_signature", "the Slack signature does not match the body", status=401) from None
    if abs(time.time() - int(timestamp)) > SIGNATURE_WINDOW_S:
        raise SlackError(
            "stale_request", "the request's timestamp is more than five minutes away", status=401
        )
    if not SignatureVerifier(secret).is_valid(body=body, timestamp=timestamp, signature=signature):
        raise SlackError("bad_signature", "the Slack signature does not match the body", status=401)
    expires = datetime.fromtimestamp(int(timestamp) + SIGNATURE_WINDOW_S + 60, tz=UTC)
    try:
        with transaction.atomic():
            SeenSignature.objects.create(signature=signature, expires_at=expires)
    except IntegrityError:
        raise SlackError("replayed", "this signed request was received before", status=401) from None


def prune_seen_signatures(now: datetime | None = None) -> int:
    """Forget signatures whose timestamp can no longer pass the window (cheap, indexed)."""
    deleted, _ = SeenSignature.objects.filter(expires_at__lt=now or timezone.now()).delete()
    return deleted
