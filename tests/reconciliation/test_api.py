"""The reconciliation API: observers claim and answer over HTTP, readers get the range report,
auditors the signed certificate; hostile input is a 4xx in the error shape, and another tenant
sees nothing."""

from __future__ import annotations

from typing import Any

import pytest
from sagaplane.certificate import CertificateError, verify_certificate

from core.scoping import tenant_context
from reconciliation import services
from tenants.models import Tenant
from tests.support.chains import Writer, compensated_saga, server_stream
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.transparency import settle
from transparency import services as transparency

pytestmark = pytest.mark.usefixtures("no_delay")
SINCE = "2000-01-01T00:00:00Z"


def _error_shape(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    body = response.json()
    assert isinstance(body["error"], str) and isinstance(body["detail"], str)
    return body


def _claim(person: Person, **body: Any) -> Any:
    return person.key_client().post(
        "/api/v1/reconciliation/claim", {"handlers": ["shop.refund"], **body}, format="json"
    )


def test_an_observer_claims_and_answers_over_http(alice: Person, tenant_a: Tenant, agent_a: Writer) -> None:
    compensated_saga(agent_a, "checkout-1", charges=["ch_1", "ch_2"])
    in_tenant(services.scan, tenant_a)
    response = _claim(alice, worker="billing-observer")
    assert response.status_code == 200
    checks = response.json()["checks"]
    assert {c["kwargs"]["charge_id"] for c in checks} == {"ch_1", "ch_2"}
    assert all(c["token"] == 1 and c["handler"] == "shop.refund" for c in checks)
    for c in checks:
        answer = c["kwargs"]["charge_id"] == "ch_1"
        reply = alice.key_client().post(
            f"/api/v1/reconciliation/checks/{c['id']}/report",
            {"token": c["token"], "reversed": answer, "detail": "ledger"},
            format="json",
        )
        assert reply.status_code == 200 and reply.json()["status"] == ("confirmed" if answer else "drift")
    report = alice.key_client().get("/api/v1/reconciliation/report", {"since": SINCE}).json()
    assert report["outcome"] == "drift"
    assert report["counts"] == {"confirmed": 1, "drift": 1, "unverifiable": 0, "pending": 0}
    verdicts = [r for r in server_stream(tenant_a) if r["event"] == services.VERDICT_EVENT]
    assert {v["observer"] for v in verdicts} == {"billing-observer"}
    assert all(v["actor"].startswith("api-key:") for v in verdicts)


def test_a_stale_token_is_409_in_the_error_shape(
    alice: Person, tenant_a: Tenant, agent_a: Writer, settings
) -> None:
    settings.SAGAPLANE_RECONCILE_LEASE_SECONDS = 0  # a claim's lease has lapsed by the next claim
    compensated_saga(agent_a, "checkout-1")
    in_tenant(services.scan, tenant_a)
    (old,) = _claim(alice).json()["checks"]
    (new,) = _claim(alice).json()["checks"]
    assert new["token"] == old["token"] + 1
    stale = alice.key_client().post(
        f"/api/v1/reconciliation/checks/{old['id']}/report",
        {"token": old["token"], "reversed": True},
        format="json",
    )
    assert _error_shape(stale, 409)["error"] == "stale_token"


def test_the_long_poll_answers_empty_after_its_wait(alice: Person) -> None:
    response = _claim(alice, wait=0.3)
    assert response.status_code == 200 and response.json() == {"checks": []}


@pytest.mark.parametrize(
    "body",
    [
        {"handlers": "shop.refund"},
        {"handlers": []},
        {"handlers": [None]},
        {"handlers": ["x" * 201]},
        {"handlers": ["shop\x00refund"]},
        {"handlers": ["shop.refund"] * 201},
        {"handlers": ["shop.refund"], "max": 0},
        {"handlers": ["shop.refund"], "max": 10**30},
        {"handlers": ["shop.refund"], "max": "5"},
        {"handlers": ["shop.refund"], "wait": -1},
        {"handlers": ["shop.refund"], "wait": "forever"},
        {"handlers": ["shop.refund"], "worker": ["w"]},
        {"handlers": ["shop.refund"], "worker": "w" * 201},
        [],
    ],
)
def test_hostile_claims_are_400(alice: Person, body: Any) -> None:
    response = alice.key_client().post("/api/v1/reconciliation/claim", body, format="json")
    _error_shape(response, 400)


@pytest.mark.parametrize(
    "body",
    [
        {"token": 1},
        {"token": "1", "reversed": True},
        {"token": 1.0, "reversed": True},
        {"token": 1, "reversed": "false"},
        {"token": 1, "reversed": 0},
        {"token": 1, "reversed": True, "detail": {"a": 1}},
        {"token": 1, "reversed": None, "error": "yes"},
        "not an object",
    ],
)
def test_hostile_answers_are_400(alice: Person, tenant_a: Tenant, agent_a: Writer, body: Any) -> None:
    compensated_saga(agent_a, "checkout-1")
    in_tenant(services.scan, tenant_a)
    (check,) = _claim(alice).json()["checks"]
    response = alice.key_client().post(
        f"/api/v1/reconciliation/checks/{check['id']}/report", body, format="json"
    )
    _error_shape(response, 400)


@pytest.mark.parametrize("check_id", ["not-a-uuid", "00000000-0000-0000-0000-000000000000", "%00", "x" * 300])
def test_unknown_checks_are_404(alice: Person, check_id: str) -> None:
    response = alice.key_client().post(
        f"/api/v1/reconciliation/checks/{check_id}/report", {"token": 1, "reversed": True}, format="json"
    )
    assert response.status_code in (400, 404)
    _error_shape(response, response.status_code)


@pytest.mark.parametrize(
    "query",
    [
        {},
        {"since": ""},
        {"since": "yesterday"},
        {"since": "1e9"},
        {"since": "-5"},
        {"since": "99999999999999999999"},
        {"since": "1999-12-31T00:00:00Z"},
        {"since": "9999-12-31T23:59:59"},
        {"since": "2026-13-40"},
        {"since": "2026-01-01T00:00:00+99:00"},
        {"since": "2" * 5000},
        {"since": "٢٠٢٦-01-01"},
        {"since": "2026-01-02", "until": "2026-01-01"},
        {"since": "2026-01-01", "until": "soon"},
    ],
)
@pytest.mark.parametrize("route", ["/api/v1/reconciliation/report", "/api/v1/audit/certificate"])
def test_hostile_ranges_are_400(alice: Person, tenant_a: Tenant, route: str, query: dict[str, str]) -> None:
    writer = Writer(tenant_a, "agent-a-1")
    writer.saga("s1")
    settle(tenant_a)  # a signed log, so the certificate's refusal can only be the range's
    body = _error_shape(alice.key_client().get(route, query), 400)
    assert body["field"] in ("since", "until")


def test_the_range_accepts_unix_seconds_and_dates(alice: Person) -> None:
    for since in ("1700000000", "1700000000.5", "2026-01-01", "2026-01-01T00:00:00+02:00"):
        response = alice.key_client().get("/api/v1/reconciliation/report", {"since": since})
        assert response.status_code == 200, (since, response.content)


def test_the_certificate_names_each_exception_and_verifies_offline(
    alice: Person, tenant_a: Tenant, agent_a: Writer
) -> None:
    agent_a.saga("clean-1")  # two committed steps in a completed saga: accounted for
    compensated_saga(agent_a, "refund-drift", charges=["ch_d"])
    compensated_saga(agent_a, "refund-ok", charges=["ch_ok"])
    compensated_saga(agent_a, "refund-failed", charges=["ch_x", "ch_y"], failed=True)
    in_tenant(services.scan, tenant_a)
    for check in _claim(alice).json()["checks"]:
        answer = check["kwargs"]["charge_id"] in ("ch_ok", "ch_x")
        alice.key_client().post(
            f"/api/v1/reconciliation/checks/{check['id']}/report",
            {"token": check["token"], "reversed": answer},
            format="json",
        )
    settle(tenant_a)
    response = alice.key_client().get("/api/v1/audit/certificate", {"since": SINCE})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    note = response.content.decode()
    with tenant_context(tenant_a):
        keys = transparency.current_verifier_keys()
    cert = verify_certificate(note, keys)
    reasons = sorted((e["saga_id"], e["reason"]) for e in cert.exceptions)
    assert reasons == [("refund-drift", "drift"), ("refund-failed", "compensation_failed")]
    assert cert.statement["accounted"] == {"completed": 2, "compensated_confirmed": 2, "resolved": 0}
    assert cert.statement["effects"] == 6 and not cert.clean
    # Tampered: one exception dropped from the statement, the signature kept.
    tampered = note.replace('"reason":"drift"', '"reason":"fine!"')
    assert tampered != note
    with pytest.raises(CertificateError):
        verify_certificate(tampered, keys)
    issued = [r for r in server_stream(tenant_a) if r["event"] == services.CERTIFICATE_EVENT]
    assert len(issued) == 1 and issued[0]["exceptions"] == 2


def test_a_third_tenant_sees_nothing(
    alice: Person, carol: Person, tenant_a: Tenant, tenant_b: Tenant, agent_a: Writer
) -> None:
    compensated_saga(agent_a, "acme-refund")
    in_tenant(services.scan, tenant_a)
    assert _claim(carol).json() == {"checks": []}
    (check,) = _claim(alice).json()["checks"]
    answer = carol.key_client().post(
        f"/api/v1/reconciliation/checks/{check['id']}/report",
        {"token": check["token"], "reversed": True},
        format="json",
    )
    _error_shape(answer, 404)
    recheck = carol.session_client().post(f"/api/v1/reconciliation/checks/{check['id']}/recheck")
    _error_shape(recheck, 404)
    report = carol.key_client().get("/api/v1/reconciliation/report", {"since": SINCE}).json()
    assert report["items"] == [] and report["outcome"] == "confirmed"
    Writer(tenant_b, "agent-b-1").saga("bravo-1")
    settle(tenant_b)
    with tenant_context(tenant_b):
        keys = transparency.current_verifier_keys()
    cert = verify_certificate(
        carol.key_client().get("/api/v1/audit/certificate", {"since": SINCE}).content, keys
    )
    assert "acme" not in str(cert.statement) and cert.statement["effects"] == 2 and cert.clean
