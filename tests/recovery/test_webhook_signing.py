"""Webhook deliveries are signed as Standard Webhooks 1.0 says (`webhook-id`, `webhook-timestamp`,
`webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`, the key being the bytes
of a `whsec_<base64>` secret), so a receiver verifies them with the standard's own library (here
its Python package, as the receiver would); the deprecated `Sagaplane-Signature` is still sent
beside them for one release."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from recovery import services, webhook
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.scoping import in_tenant


class Receiver(ThreadingHTTPServer):
    """Keeps every delivery's raw body and headers (as received), answers 204."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[bytes, dict[str, str]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                server.deliveries.append((body, dict(self.headers.items())))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/hook"


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    settings.SAGAPLANE_WEBHOOK_ALLOW_PRIVATE = True  # the receiver listens on loopback
    server = Receiver()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


BODY = json.dumps({"type": "recovery.job", "kwargs": {"charge_id": "ch_1"}}, separators=(",", ":")).encode()


def deliver(
    receiver: Receiver, secret: str, key: str = "refund.ch_1.compensate"
) -> tuple[bytes, dict[str, str]]:
    status, _ = webhook.post(receiver.url, BODY, secret=secret, idempotency_key=key, agent="test")
    assert status == 204
    return receiver.deliveries[-1]


def test_a_delivery_verifies_with_the_standard_library(receiver: Receiver) -> None:
    secret = webhook.new_secret()
    body, headers = deliver(receiver, secret)
    assert Webhook(secret).verify(body, headers) == json.loads(BODY)
    lower = {name.lower(): value for name, value in headers.items()}
    # The id is the standard's idempotency key: no `.` (the key above has some), nothing chosen by
    # the agent; the signature is one `v1,` entry.
    assert re.fullmatch(r"msg_[0-9a-f]{32}", lower["webhook-id"])
    assert lower["webhook-timestamp"].isdigit()
    assert re.fullmatch(r"v1,[A-Za-z0-9+/]{43}=", lower["webhook-signature"])
    # Forgeries fail the standard's check: another body, another secret, another id, an old time.
    for forged_body, forged_headers, other_secret in [
        (body.replace(b"ch_1", b"ch_2"), headers, secret),
        (body, headers, webhook.new_secret()),
        (body, {**lower, "webhook-id": "msg_" + "0" * 32}, secret),
        (body, {**lower, "webhook-timestamp": str(int(lower["webhook-timestamp"]) - 3600)}, secret),
        (body, {k: v for k, v in lower.items() if k != "webhook-signature"}, secret),
    ]:
        with pytest.raises(WebhookVerificationError):
            Webhook(other_secret).verify(forged_body, forged_headers)


def test_every_attempt_of_a_delivery_has_the_same_id(receiver: Receiver) -> None:
    secret = webhook.new_secret()
    first = deliver(receiver, secret)[1]
    again = deliver(receiver, secret)[1]
    other = deliver(receiver, secret, key="refund.ch_2.compensate")[1]
    assert first["webhook-id"] == again["webhook-id"] != other["webhook-id"]
    assert first["Idempotency-Key"] == "refund.ch_1.compensate"


def test_the_deprecated_header_is_still_sent_and_verifies(receiver: Receiver) -> None:
    secret = webhook.new_secret()
    body, headers = deliver(receiver, secret)
    fields = dict(part.split("=", 1) for part in headers["Sagaplane-Signature"].split(","))
    assert fields["t"] == headers["webhook-timestamp"]
    expected = hmac.new(secret.encode(), f"{fields['t']}.".encode() + body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(expected, fields["v1"])


@pytest.mark.django_db
def test_the_secret_is_in_the_standards_form(tenant_a: Tenant) -> None:
    _, secret = in_tenant(
        services.set_webhook,
        tenant_a,
        services.WebhookSet.parse({"url": "https://93.184.216.34/hook"}),
        actor=named_actor("test"),
    )
    assert secret.startswith("whsec_")
    key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    assert len(key) == 32 and webhook.standard_key(secret) == key
    Webhook(secret)  # the library reads it


def test_a_secret_issued_before_is_converted_as_the_docs_say(receiver: Receiver) -> None:
    """Url-safe and unpadded (a quarter of them the library cannot even read): the standard
    signature is keyed by the bytes it encodes; the documented conversion makes it readable."""
    legacy = "whsec_" + secrets.token_urlsafe(32)
    while "-" not in legacy and "_" not in legacy[6:]:
        legacy = "whsec_" + secrets.token_urlsafe(32)
    body, headers = deliver(receiver, legacy)
    converted = "whsec_" + base64.b64encode(base64.urlsafe_b64decode(legacy[6:] + "==")).decode()
    Webhook(converted).verify(body, headers)
