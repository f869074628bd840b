"""The tenant's webhook as an observer: checks of the handlers it serves are claimed for it by the
pass and POSTed signed (recovery's Standard Webhooks signature, the same secret, verified here with
the standard's own library) to a real HTTP server; its `{"reversed": ...}` becomes the verdict. A
failed delivery records nothing and is retried under a new token once the claim lapses; an answer
without a verdict is unverifiable."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from core.scoping import tenant_context
from reconciliation import services
from reconciliation.models import CheckStatus, ReconciliationCheck
from reconciliation.tasks import deliver_check
from recovery import services as recovery
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.chains import Writer, compensated_saga, server_stream
from tests.support.scoping import in_tenant

pytestmark = pytest.mark.usefixtures("no_delay")


def verify_signature(secret: str, body: bytes, headers: dict[str, str]) -> bool:
    """The receiver's check: Standard Webhooks' library, and the deprecated `Sagaplane-Signature:
    t=<unix s>,v1=<hex HMAC-SHA256 of "<t>." + body>` still sent beside it."""
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    header = headers.get("Sagaplane-Signature", "")
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    timestamp, given = fields.get("t", ""), fields.get("v1", "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > 300:
        return False
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, given)


class Receiver:
    """The tenant's endpoint: checks the signature, then answers from its ledger."""

    def __init__(self) -> None:
        self.secret = ""
        self.refunded = {"ch_ok"}
        self.fail_next = 0
        self.without_verdict = False
        self.seen: list[dict[str, Any]] = []

    def answer(self, body: bytes, headers: dict[str, str], key: str) -> tuple[int, bytes]:
        if not verify_signature(self.secret, body, headers):
            return 401, b"{}"
        delivery = json.loads(body)
        self.seen.append({**delivery, "idempotency_key": key})
        if self.fail_next:
            self.fail_next -= 1
            return 500, b"{}"
        if self.without_verdict:
            return 200, b'{"ok": true}'
        charge = delivery["check"]["kwargs"]["charge_id"]
        return 200, json.dumps({"reversed": charge in self.refunded, "detail": f"ledger {charge}"}).encode()


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status, out = state.answer(
                body, dict(self.headers.items()), self.headers.get("Idempotency-Key", "")
            )
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}/sagaplane"
    finally:
        server.shutdown()
        server.server_close()


def _deliver_due(tenant: Tenant) -> list[str]:
    return [
        deliver_check(tenant.pk, check_id, token)
        for check_id, token in in_tenant(services.claim_for_webhook, tenant)
    ]


def test_the_webhook_answers_checks_and_its_answers_are_verdicts(
    tenant_a: Tenant, agent_a: Writer, receiver: tuple[Receiver, str]
) -> None:
    state, url = receiver
    _, state.secret = in_tenant(
        recovery.set_webhook,
        tenant_a,
        recovery.WebhookSet.parse({"url": url, "handlers": ["shop.refund"]}),
        actor=named_actor("test"),
    )
    compensated_saga(agent_a, "refund-ok", charges=["ch_ok"])
    compensated_saga(agent_a, "refund-lost", charges=["ch_lost"])
    compensated_saga(agent_a, "voided", handler="shop.void")  # not the webhook's: left for SDK observers
    in_tenant(services.scan, tenant_a)
    assert sorted(_deliver_due(tenant_a)) == ["answered", "answered"]
    with tenant_context(tenant_a):
        verdicts = {c.saga_id: (c.status, c.observer) for c in ReconciliationCheck.objects.all()}
    assert verdicts == {
        "refund-ok": (CheckStatus.CONFIRMED, "webhook"),
        "refund-lost": (CheckStatus.DRIFT, "webhook"),
        "voided": (CheckStatus.PENDING, ""),
    }
    records = [r for r in server_stream(tenant_a) if r["event"] == services.VERDICT_EVENT]
    assert {r["actor"] for r in records} == {str(services.WEBHOOK_ACTOR)}
    assert all(
        s["type"] == "reconciliation.check" and s["idempotency_key"].startswith("reconcile-")
        for s in state.seen
    )


def test_a_failed_delivery_is_retried_under_a_new_token(
    tenant_a: Tenant, agent_a: Writer, receiver: tuple[Receiver, str], settings: Any
) -> None:
    settings.SAGAPLANE_RECONCILE_LEASE_SECONDS = 0  # a claim's lease has lapsed by the next claim
    state, url = receiver
    _, state.secret = in_tenant(
        recovery.set_webhook, tenant_a, recovery.WebhookSet.parse({"url": url}), actor=named_actor("test")
    )  # every handler
    compensated_saga(agent_a, "refund-ok", charges=["ch_ok"])
    in_tenant(services.scan, tenant_a)
    state.fail_next = 1
    assert _deliver_due(tenant_a) == ["HTTP 500"]
    with tenant_context(tenant_a):
        assert ReconciliationCheck.objects.get().status == CheckStatus.CLAIMED  # nothing recorded
    assert _deliver_due(tenant_a) == ["answered"]  # the lapsed claim, taken again
    tokens = [s["check"]["token"] for s in state.seen]
    assert tokens == [1, 2] and len({s["idempotency_key"] for s in state.seen}) == 2
    with tenant_context(tenant_a):
        assert ReconciliationCheck.objects.get().status == CheckStatus.CONFIRMED


def test_an_answer_without_a_verdict_is_unverifiable(
    tenant_a: Tenant, agent_a: Writer, receiver: tuple[Receiver, str]
) -> None:
    state, url = receiver
    _, state.secret = in_tenant(
        recovery.set_webhook, tenant_a, recovery.WebhookSet.parse({"url": url}), actor=named_actor("test")
    )
    state.without_verdict = True
    compensated_saga(agent_a, "refund-ok", charges=["ch_ok"])
    in_tenant(services.scan, tenant_a)
    assert _deliver_due(tenant_a) == ["answered"]
    with tenant_context(tenant_a):
        check = ReconciliationCheck.objects.get()
    assert (check.status, check.reason) == (CheckStatus.UNVERIFIABLE, "observer_unknown")


def test_without_a_webhook_nothing_is_claimed_for_one(tenant_a: Tenant, agent_a: Writer) -> None:
    compensated_saga(agent_a, "refund-ok", charges=["ch_ok"])
    in_tenant(services.scan, tenant_a)
    assert in_tenant(services.claim_for_webhook, tenant_a) == []
