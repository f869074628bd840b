"""A tenant's webhook URL cannot reach the control plane's own network: with
SAGAPLANE_WEBHOOK_ALLOW_PRIVATE off (production's default), a URL resolving to loopback, private,
link-local (the metadata service), shared, multicast or reserved space is refused when it is set
(400) and at each delivery (a failed attempt, escalated once attempts run out); the connection
goes to the very address that was vetted (a rebinding name server gets no second say), and a
redirect is never followed. Both databases."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from core import outbound
from core.scoping import tenant_context
from recovery import services, webhook
from recovery.models import Delivery, Job, JobState, Webhook
from recovery.tasks import deliver_webhook
from tenants.actors import named_actor
from tests.recovery.sagas import crashed, sweep_later
from tests.support.chains import Writer, server_stream
from tests.support.factories import Person
from tests.support.scoping import in_tenant

PUBLIC = "93.184.216.34"


@pytest.fixture
def strict(settings: Any) -> Any:
    settings.SAGAPLANE_WEBHOOK_ALLOW_PRIVATE = False
    return settings


class Hits(ThreadingHTTPServer):
    """A local receiver: counts requests; answers `status` (with `location` for a redirect)."""

    def __init__(self, status: int = 200, location: str = "") -> None:
        self.hits: list[str] = []
        self.status = status
        self.location = location
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                server.hits.append(self.path)
                self.send_response(server.status)
                if server.location:
                    self.send_header("Location", server.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST  # noqa: N815 (a followed redirect would GET)

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def receiver() -> Iterator[Hits]:
    server = Hits()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


REFUSED = [
    "http://127.0.0.1:8080/hook",
    "http://localhost/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.1.2.3/hook",
    "http://172.16.0.1/hook",
    "http://192.168.1.10/hook",
    "http://100.64.0.1/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[fe80::1]/hook",
    "http://[fd00::1]/hook",
    "http://224.0.0.1/hook",
    "http://240.0.0.1/hook",
    "http://0.0.0.0/hook",
    "https://127.0.0.1:443/hook",
]


@pytest.mark.django_db
@pytest.mark.parametrize("url", REFUSED)
def test_a_private_url_is_refused_when_set(alice: Person, strict: Any, url: str) -> None:
    response = alice.session_client().put("/api/v1/recovery/webhook", {"url": url}, format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["field"] == "url" and body["error"] in ("unsafe_url", "invalid")
    with tenant_context(alice.tenant):
        assert not Webhook.objects.exists()
    assert not [r for r in server_stream(alice.tenant) if r["event"] == "RECOVERY_WEBHOOK_SET"]


@pytest.mark.django_db
def test_the_refusal_names_the_address(alice: Person, strict: Any) -> None:
    body = (
        alice.session_client()
        .put("/api/v1/recovery/webhook", {"url": "http://169.254.169.254/x"}, format="json")
        .json()
    )
    assert body["error"] == "unsafe_url"
    assert "169.254.169.254" in body["detail"] and "link-local" in body["detail"]


@pytest.mark.django_db
def test_a_public_address_is_accepted_and_the_setting_allows_a_local_one(alice: Person, strict: Any) -> None:
    def put(url: str) -> int:
        response = alice.session_client().put("/api/v1/recovery/webhook", {"url": url}, format="json")
        return int(response.status_code)

    assert put(f"https://{PUBLIC}/hook") == 200
    strict.SAGAPLANE_WEBHOOK_ALLOW_PRIVATE = True
    assert put("http://127.0.0.1:9/hook") == 200


@pytest.mark.django_db
def test_a_delivery_to_a_private_address_is_a_failed_attempt_then_escalates(
    alice: Person, writer_a: Writer, settings: Any, receiver: Hits
) -> None:
    """Set while allowed (or the name resolved elsewhere then): each delivery checks again."""
    tenant = alice.tenant
    settings.SAGAPLANE_WEBHOOK_ALLOW_PRIVATE = True
    url = f"http://127.0.0.1:{receiver.server_port}/hook"
    in_tenant(
        services.set_webhook, tenant, services.WebhookSet.parse({"url": url}), actor=named_actor("test")
    )
    crashed(writer_a, "ssrf", steps=1)
    sweep_later(tenant)
    settings.SAGAPLANE_WEBHOOK_ALLOW_PRIVATE = False
    with tenant_context(tenant):
        job = Job.objects.get(saga_id="ssrf")
        assert job.delivery == Delivery.WEBHOOK
        Job.objects.filter(pk=job.pk).update(max_attempts=2)
    assert deliver_webhook(tenant.pk, str(job.pk)) == "unreachable"
    with tenant_context(tenant):
        job.refresh_from_db()
        assert job.state == JobState.PENDING
        assert "127.0.0.1" in job.last_error and "loopback" in job.last_error
        Job.objects.filter(pk=job.pk).update(available_at=job.created_at)  # the backoff is over
    assert deliver_webhook(tenant.pk, str(job.pk)) == "unreachable"
    with tenant_context(tenant):
        job.refresh_from_db()
        assert job.state == JobState.ESCALATED and job.escalation == "retries_exhausted"
    assert receiver.hits == []  # nothing ever reached the address
    failed = [r for r in server_stream(tenant) if r["event"] == "COMPENSATION_FAILED"]
    assert [r["final"] for r in failed] == [False, True]
    assert all("loopback" in r["error"] for r in failed)


def test_the_connection_goes_to_the_vetted_address(strict: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name server that answers a public address, then loopback (DNS rebinding): one lookup per
    delivery, and the socket connects to exactly the address that lookup vetted."""
    answers = iter([PUBLIC, "127.0.0.1"])
    lookups: list[str] = []
    connected: list[tuple[str, int]] = []

    def lookup(host: str, port: int, **_: Any) -> list[Any]:
        lookups.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    def connect(address: tuple[str, int], timeout: float) -> socket.socket:
        connected.append(address)
        raise ConnectionRefusedError("test: no network")

    monkeypatch.setattr(outbound, "_lookup", lookup)
    monkeypatch.setattr(outbound, "_connect", connect)
    args = {"secret": "s", "idempotency_key": "k", "agent": "test"}
    with pytest.raises(ConnectionRefusedError):
        webhook.post("http://rebind.example/hook", b"{}", **args)
    assert lookups == ["rebind.example"] and connected == [(PUBLIC, 80)]
    with pytest.raises(webhook.UnsafeAddress):
        webhook.post("http://rebind.example/hook", b"{}", **args)
    assert connected == [(PUBLIC, 80)]  # the loopback answer was never connected to


def test_a_name_with_any_private_address_is_refused(strict: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def lookup(host: str, port: int, **_: Any) -> list[Any]:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC, port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port)),
        ]

    monkeypatch.setattr(outbound, "_lookup", lookup)
    assert "10.0.0.7" in webhook.check_url("https://mixed.example/hook")
    with pytest.raises(webhook.UnsafeAddress):
        webhook.post("https://mixed.example/hook", b"{}", secret="s", idempotency_key="k", agent="test")


def test_a_redirect_is_an_answer_never_followed(settings: Any) -> None:
    settings.SAGAPLANE_WEBHOOK_ALLOW_PRIVATE = True  # both servers are local
    target = Hits()
    redirector = Hits(302, "")
    for server in (target, redirector):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    redirector.location = f"http://127.0.0.1:{target.server_port}/metadata"
    try:
        url = f"http://127.0.0.1:{redirector.server_port}/hook"
        status, _ = webhook.post(url, b"{}", secret="s", idempotency_key="k", agent="t")
        assert status == 302
        assert redirector.hits == ["/hook"] and target.hits == []
    finally:
        for server in (target, redirector):
            server.shutdown()
            server.server_close()


# Every way an IPv6 address can carry an IPv4 one: judged by what it carries, or refused outright
# (6to4, Teredo, local-use NAT64, IPv4-compatible). (address, what the refusal names; '' = allowed)
EMBEDDED = [
    ("2002:7f00:1::", "6to4, carrying 127.0.0.1"),
    ("2002:a9fe:a9fe::", "6to4, carrying 169.254.169.254"),
    ("2002:0a00:0001::1", "6to4, carrying 10.0.0.1"),
    ("2002:c0a8:0101::", "6to4, carrying 192.168.1.1"),
    ("2002:5db8:d822::1", "6to4, carrying 93.184.216.34"),  # a public one: 6to4 is refused outright
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
    ("2001:0:a00:1:8000:63bf:80ff:fefe", "Teredo, carrying 127.0.1.1"),
    ("64:ff9b::7f00:1", "loopback, carried as 127.0.0.1"),
    ("64:ff9b::a9fe:a9fe", "link-local, carried as 169.254.169.254"),
    ("64:ff9b::a00:1", "private, carried as 10.0.0.1"),
    ("64:ff9b::6440:1", "carried as 100.64.0.1"),  # shared address space
    ("64:ff9b::5db8:d822", ""),  # NAT64 to a public address: how an IPv6-only host reaches IPv4
    ("64:ff9b:1::a00:1", "local-use NAT64"),
    ("64:ff9b:1:5db8:d8:2200::", "local-use NAT64"),
    ("::ffff:127.0.0.1", "loopback, carried as 127.0.0.1"),
    ("::ffff:10.0.0.1", "private, carried as 10.0.0.1"),
    ("::ffff:93.184.216.34", ""),
    ("::ffff:0:7f00:1", "loopback, carried as 127.0.0.1"),  # IPv4-translated (SIIT)
    ("::7f00:1", "IPv4-compatible"),
    ("::5db8:d822", "IPv4-compatible"),
    ("2606:4700:1:2:0:5efe:a00:1", "private, carried as 10.0.0.1 (ISATAP)"),
    ("2606:4700:1:2:200:5efe:7f00:1", "loopback, carried as 127.0.0.1 (ISATAP)"),
    ("2606:4700:1:2:0:5efe:5db8:d822", ""),
    ("2606:4700::1111", ""),
    ("::1", "loopback"),
    ("fe80::1", "link-local"),
    ("fd00::1", "private"),
    ("::", "unspecified"),
    ("ff02::1", "multicast"),
    ("93.184.216.34", ""),
    ("127.0.0.1", "loopback"),
]


@pytest.mark.parametrize(("address", "why"), EMBEDDED)
def test_every_embedding_of_an_ipv4_address_is_judged(address: str, why: str) -> None:
    import ipaddress

    found = webhook.forbidden(ipaddress.ip_address(address))
    if why:
        assert why in found, (address, found)
    else:
        assert found == "", (address, found)


@pytest.mark.parametrize(
    "url",
    [
        "http://[2002:7f00:1::]/",
        "http://[2002:a9fe:a9fe::]/latest/meta-data/",
        "http://[2002:0a00:0001::1]/hook",
        "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/hook",
        "http://[64:ff9b::7f00:1]/hook",
        "http://[64:ff9b::a9fe:a9fe]/hook",
        "http://[64:ff9b:1::a00:1]/hook",
        "http://[::ffff:0:a00:1]/hook",
        "http://[::127.0.0.1]/hook",
    ],
)
def test_a_url_carrying_a_forbidden_ipv4_address_is_refused(strict: Any, url: str) -> None:
    assert "public addresses only" in webhook.check_url(url)
    with pytest.raises(webhook.UnsafeAddress):
        webhook.post(url, b"{}", secret="s", idempotency_key="k", agent="test")


def test_a_nat64_address_of_a_public_receiver_is_allowed(strict: Any) -> None:
    assert webhook.check_url(f"http://[64:ff9b::{PUBLIC}]/hook") == ""
