"""POST /api/v1/audit/redactions: payload and salt erased, chain still verifies, act recorded."""

from __future__ import annotations

from typing import Any

import pytest
from sagaplane.chain import verify_chain

from audit import services
from audit.models import Record, RecordPayload, Redaction
from core.scoping import tenant_context
from tenants import services as tenant_services
from tenants.actors import named_actor, user_actor
from tenants.inputs import NewApiKey
from tenants.models import Role
from tests.support.chains import chain, saga_records
from tests.support.factories import Person, make_person
from tests.support.scoping import in_tenant

URL = "/api/v1/audit/redactions"


def _stream(tenant: Any, stream_id: str) -> list[dict[str, Any]]:
    with tenant_context(tenant):
        rows = list(Record.objects.filter(stream__stream_id=stream_id).order_by("position"))
        payloads = {p.record_id: p for p in RecordPayload.objects.filter(record__in=rows)}
        erased = dict(Redaction.objects.values_list("record_id", "reason"))
        return [services.stored_record(r, payloads.get(r.pk), erased.get(r.pk)) for r in rows]


def test_owner_erases_a_record_and_the_chain_still_verifies(alice: Person) -> None:
    records = chain(saga_records("er", steps=2))
    in_tenant(services.ingest, alice.tenant, "er", records, actor=named_actor("test"))
    response = alice.session_client().post(
        URL, {"stream": "er", "position": 3, "reason": "GDPR art. 17"}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["hash"] == records[2]["_h"] and body["server_record"]["stream"] == "server"
    stored = _stream(alice.tenant, "er")
    assert stored[2] == {k: records[2][k] for k in ("seq", "ts", "event", "_cd", "_ph", "_h")} | {
        "_redacted": "GDPR art. 17"
    }
    assert verify_chain(stored).intact and verify_chain(stored).redacted == 1
    server = _stream(alice.tenant, "server")
    act = server[-1]
    assert act["event"] == "AUDIT_RECORD_REDACTED" and act["record_hash"] == records[2]["_h"]
    assert act["actor"] == f"user:{alice.user.username}" and act["reason"] == "GDPR art. 17"
    assert verify_chain(server).intact
    # the saga view shows it as redacted, and the erased compensation is gone from the projection
    detail = alice.session_client().get("/api/v1/sagas/er").json()
    shown = detail["records"][2]
    assert shown["redacted"] is True and "kwargs" not in shown["record"]
    assert "ch_0" not in str(detail)
    again = alice.session_client().post(
        URL, {"stream": "er", "hash": records[2]["_h"], "reason": "x"}, format="json"
    )
    assert again.status_code == 409


def test_who_may_erase(alice: Person, bob: Person, tenant_a: Any) -> None:
    in_tenant(services.ingest, alice.tenant, "w", chain(saga_records()), actor=named_actor("test"))
    payload = {"stream": "w", "position": 1, "reason": "r"}
    assert bob.session_client().post(URL, payload, format="json").status_code == 403  # viewer
    assert alice.key_client().post(URL, payload, format="json").status_code == 403  # API keys never
    auditor = make_person(tenant_a, "audrey", Role.AUDITOR)
    assert auditor.session_client().post(URL, payload, format="json").status_code == 201


@pytest.mark.parametrize(
    "payload",
    [
        {"stream": "w", "position": 1},
        {"stream": "w", "reason": "r"},
        {"stream": "w", "position": 1, "hash": "a" * 64, "reason": "r"},
    ],
)
def test_bad_requests(alice: Person, payload: dict) -> None:
    in_tenant(services.ingest, alice.tenant, "w", chain(saga_records()), actor=named_actor("test"))
    response = alice.session_client().post(URL, payload, format="json")
    assert response.status_code == 400 and response.json()["field"] in ("reason", "position")


def test_unknown_record_is_404(alice: Person, carol: Person) -> None:
    in_tenant(services.ingest, alice.tenant, "w", chain(saga_records()), actor=named_actor("test"))
    response = carol.session_client().post(URL, {"stream": "w", "position": 1, "reason": "r"}, format="json")
    assert response.status_code == 404
    with tenant_context(alice.tenant):
        assert RecordPayload.objects.filter(record__stream__stream_id="w").count() == 4


def test_admin_actions_are_in_the_server_stream(alice: Person, tenant_a: Any) -> None:
    api_key, raw = in_tenant(
        tenant_services.create_api_key,
        tenant_a,
        NewApiKey(name="ci", scopes=["read"]),
        actor=user_actor("alice"),
    )
    with tenant_context(tenant_a):
        tenant_services.revoke_api_key(api_key, actor=user_actor("alice"))
    server = _stream(tenant_a, "server")
    created = next(r for r in server if r["event"] == "ADMIN_API_KEY_CREATED" and r["name"] == "ci")
    assert created["prefix"] == api_key.prefix and created["new"]["scopes"] == ["read"]
    # sp_<prefix>_<secret>: the secret itself may hold "_", so split twice only.
    assert raw not in str(server) and raw.split("_", 2)[2] not in str(server)
    assert server[-1]["event"] == "ADMIN_API_KEY_REVOKED" and server[-1]["actor"] == "user:alice"
    assert any(r["event"] == "ADMIN_MEMBER_ADDED" and r["user"] == alice.user.username for r in server)
    assert verify_chain(server).intact
