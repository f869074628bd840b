"""The lean proof path (transparency/lean.py) answers a plain proof GET byte for byte as the full
stack does, with the same headers and log line, and hands everything else to the full stack, so
every refusal keeps its error shape and every key check its rule."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from rest_framework.test import APIClient

from core.scoping import tenant_context
from tenants import fastroute
from tenants import services as tenant_services
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import ApiKey, Tenant
from tests.support.chains import Writer
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.transparency import settle
from transparency import api

API = "/api/v1/audit/proofs"
LEAN = "transparency.lean.LeanProofMiddleware"
# Per answer: the request id is new each time, the rest must be equal.
_OWN = {"X-Request-ID", "Date"}


@pytest.fixture
def log_a(tenant_a: Tenant, writer_a: Writer) -> int:
    for n in range(3):
        writer_a.saga(f"s{n}")
    settle(tenant_a)
    with tenant_context(tenant_a):
        from transparency import proofs

        checkpoint = proofs.latest_checkpoint()
        assert checkpoint is not None
        return checkpoint.size


def client_of(raw_key: str, **headers: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}", **headers)
    return client


@contextmanager
def full_stack() -> Iterator[None]:
    with override_settings(MIDDLEWARE=[m for m in settings.MIDDLEWARE if m != LEAN]):
        yield


class ViewCalls:
    """How many times the DRF proof views ran (the lean path runs neither)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        for view in (api.InclusionProofView, api.ConsistencyProofView):
            original = view.get

            def counted(this: Any, request: Any, _original: Any = original) -> Any:
                self.n += 1
                return _original(this, request)

            monkeypatch.setattr(view, "get", counted)


def answer(
    raw_key: str, path: str, params: dict[str, Any], **headers: str
) -> tuple[int, bytes, dict[str, str]]:
    response = client_of(raw_key, **headers).get(f"{API}/{path}", params)
    return response.status_code, response.content, {k: v for k, v in response.items() if k not in _OWN}


def test_a_plain_proof_call_is_answered_lean_exactly_as_the_full_stack_answers_it(
    alice: Person, log_a: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastroute, "HEADERS", fastroute.RouteHeaders())  # as in a new process
    calls = ViewCalls(monkeypatch)
    asks = [
        ("inclusion", {"index": 0}),
        ("inclusion", {"index": log_a - 1, "size": log_a}),
        ("consistency", {"first": 1}),
        ("consistency", {"first": 2, "second": log_a}),
    ]
    for path, params in asks:  # until a route has answered once, its calls go through the full stack
        assert answer(alice.api_key, path, params)[0] == 200
    assert calls.n == 2
    for path, params in asks:
        before = calls.n
        lean = answer(alice.api_key, path, params, HTTP_ACCEPT="application/json")
        assert calls.n == before, (path, params)  # answered without the view
        with full_stack():
            full = answer(alice.api_key, path, params, HTTP_ACCEPT="application/json")
        assert calls.n == before + 1
        assert lean == full and lean[0] == 200
        assert lean[2]["Content-Type"] == "application/json" and "X-Frame-Options" in lean[2]


def test_each_tenant_gets_its_own_log_on_the_lean_path(
    alice: Person, carol: Person, log_a: int, tenant_b: Tenant, writer_b: Writer
) -> None:
    writer_b.saga("only-b", steps=5)
    settle(tenant_b)
    for person in (alice, carol, alice, carol):
        lean = answer(person.api_key, "inclusion", {"index": 0})
        with full_stack():
            full = answer(person.api_key, "inclusion", {"index": 0})
        assert lean == full and lean[0] == 200
    sizes = {
        p.tenant.slug: client_of(p.api_key).get(f"{API}/inclusion", {"index": 0}).json()["size"]
        for p in (alice, carol)
    }
    assert sizes["acme"] == log_a and sizes["bravo"] != log_a


def _scoped_key(tenant: Tenant, scopes: list[str]) -> str:
    return in_tenant(
        tenant_services.create_api_key,
        tenant,
        NewApiKey(name=f"k-{'-'.join(scopes)}", scopes=scopes),
        actor=named_actor("test"),
    )[1]


def test_every_refusal_is_the_full_stacks_in_its_error_shape(
    alice: Person, log_a: int, tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastroute, "HEADERS", fastroute.RouteHeaders())
    for path, params in (("inclusion", {"index": 0}), ("consistency", {"first": 1})):
        assert answer(alice.api_key, path, params)[0] == 200  # the full stack's, once per route
    calls = ViewCalls(monkeypatch)
    assert answer(alice.api_key, "inclusion", {"index": 0})[0] == 200
    assert calls.n == 0  # the lean path is answering: what follows is handed on by it
    ingest_only = _scoped_key(tenant_a, ["ingest"])
    asks: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
        (alice.api_key, "inclusion", {}, {}),
        (alice.api_key, "inclusion", {"index": log_a}, {}),
        (alice.api_key, "inclusion", {"index": 0, "size": log_a + 1}, {}),
        (alice.api_key, "inclusion", {"index": "-1"}, {}),
        (alice.api_key, "inclusion", {"index": "٣"}, {}),
        (alice.api_key, "consistency", {"first": 0}, {}),
        (alice.api_key, "consistency", {"first": log_a, "second": 1}, {}),
        (alice.api_key, "inclusion", {"index": 0, "format": "json"}, {}),
        (alice.api_key, "inclusion", {"index": 0, "extra": "1"}, {}),
        (alice.api_key, "inclusion", {"index": 0}, {"HTTP_ACCEPT": "text/html"}),
        (alice.api_key, "inclusion", {"index": 0}, {"HTTP_ACCEPT": "application/xml"}),
        (alice.api_key, "inclusion", {"index": 0}, {"HTTP_HOST": "evil.example"}),
        (ingest_only, "inclusion", {"index": 0}, {}),
        ("sp_nothere00000_" + "x" * 40, "inclusion", {"index": 0}, {}),
        ("not-a-key", "inclusion", {"index": 0}, {}),
        (alice.api_key + "x", "inclusion", {"index": 0}, {}),
    ]
    for key, path, params, headers in asks * 2:  # the second time, every key has been checked
        lean = answer(key, path, params, **headers)
        with full_stack():
            full = answer(key, path, params, **headers)
        if lean[2]["Content-Type"].startswith(
            "text/html"
        ):  # DRF's browsable page: a new CSRF token each time
            assert (lean[0], lean[2]) == (full[0], full[2]), (key[:12], path, params, headers)
            continue
        assert lean == full, (key[:12], path, params, headers)
        if lean[0] >= 400:
            body = client_of(key, **headers).get(f"{API}/{path}", params).json()
            assert body["error"] and body["detail"], body


def test_a_revoked_or_expired_key_is_refused_at_once(alice: Person, log_a: int, tenant_a: Tenant) -> None:
    raw = _scoped_key(tenant_a, ["read"])
    assert answer(raw, "inclusion", {"index": 0})[0] == 200
    assert answer(raw, "inclusion", {"index": 0})[0] == 200  # remembered by this process now
    with tenant_context(tenant_a):
        key = ApiKey.objects.get(prefix=ApiKey.prefix_of(raw))
    with tenant_context(tenant_a):
        tenant_services.revoke_api_key(key, actor=named_actor("test"))
    status, body, _ = answer(raw, "inclusion", {"index": 0})
    assert status == 401 and b"revoked" in body
    from django.core.cache import cache

    from core import epoch

    cache.delete(epoch.hold_key(tenant_a.pk))  # the revocation's hold ended: copies are kept again
    other = _scoped_key(tenant_a, ["read"])
    assert answer(other, "inclusion", {"index": 0})[0] == 200
    assert answer(other, "inclusion", {"index": 0})[0] == 200
    from django.utils import timezone

    with tenant_context(tenant_a):
        ApiKey.objects.filter(prefix=ApiKey.prefix_of(other)).update(expires_at=timezone.now())
    from tenants import authentication

    remembered = authentication._held[ApiKey.prefix_of(other) or ""].api_key
    remembered.expires_at = timezone.now()  # the copy this process holds expires too
    status, body, _ = answer(other, "inclusion", {"index": 0})
    assert status == 401 and b"expired" in body


def test_the_lean_answer_has_its_log_line(
    alice: Person, log_a: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer(alice.api_key, "inclusion", {"index": 0})
    calls = ViewCalls(monkeypatch)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sagaplane.requests"):
        assert answer(alice.api_key, "inclusion", {"index": 1})[0] == 200
    assert calls.n == 0
    (line,) = [r for r in caplog.records if r.name == "sagaplane.requests"]
    assert line.http_route == "audit-proof-inclusion" and line.http_status == 200  # type: ignore[attr-defined]
    assert line.tenant == "acme"  # type: ignore[attr-defined]
    assert line.actor == f"api-key:{ApiKey.prefix_of(alice.api_key)}"  # type: ignore[attr-defined]


@pytest.mark.parametrize("secure", [False, True], ids=["http", "https"])
def test_the_lean_answer_has_the_full_stacks_headers_for_its_request_class(
    alice: Person, log_a: int, monkeypatch: pytest.MonkeyPatch, settings: Any, secure: bool
) -> None:
    """The fast route answers with the header names (and security headers) the normal stack gives
    a call of the same class: over https HSTS is among them, over http it is not, whichever class
    the route learnt first."""
    settings.SECURE_HSTS_SECONDS = 3600  # SecurityMiddleware sends HSTS over https only
    monkeypatch.setattr(fastroute, "HEADERS", fastroute.RouteHeaders())  # as in a new process
    calls = ViewCalls(monkeypatch)

    def names_and_security(response: Any) -> tuple[set[str], dict[str, str]]:
        headers = {k.lower(): v for k, v in response.items() if k not in _OWN}
        security = {k: v for k, v in headers.items() if k.startswith(("x-", "strict-", "referrer", "cross-"))}
        return set(headers), security

    def get(*, secure: bool) -> Any:
        response = client_of(alice.api_key).get(f"{API}/inclusion", {"index": 0}, secure=secure)
        assert response.status_code == 200
        return response

    get(secure=not secure)  # the other class is learnt first
    for _ in range(2):  # the first call of this class is the full stack's; the second, the fast route's
        fast = names_and_security(get(secure=secure))
        with full_stack():
            normal = names_and_security(get(secure=secure))
        assert fast == normal
        assert ("strict-transport-security" in fast[0]) is secure
        assert {"x-content-type-options", "x-frame-options", "referrer-policy"} <= fast[0]
    assert calls.n == 1 + 1 + 2  # the other class, this class' first call, and the two normal-stack calls
