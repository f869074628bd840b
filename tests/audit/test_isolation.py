"""Carol (tenant bravo) learns nothing of acme's streams, sagas and records."""

from __future__ import annotations

from audit import services
from audit.models import Stream
from core.scoping import tenant_context
from tenants.actors import named_actor
from tests.support.chains import chain, saga_records
from tests.support.factories import Person
from tests.support.scoping import in_tenant


def test_carol_sees_nothing_of_acmes_evidence(alice: Person, carol: Person) -> None:
    records = chain(saga_records("acme-secret-saga"))
    in_tenant(services.ingest, alice.tenant, "payments-agent", records, actor=named_actor("test"))
    for client in (carol.key_client(), carol.session_client()):
        assert client.get("/api/v1/streams/payments-agent").status_code == 404
        assert client.get("/api/v1/sagas/acme-secret-saga").status_code == 404
        listing = client.get("/api/v1/sagas").json()
        assert listing["results"] == [] and "acme-secret-saga" not in str(listing)
        report = client.get("/v1/audit/report").json()
        assert report["sagas"] == 0
    # posting the same stream id is simply a new stream in carol's own namespace
    response = carol.key_client().post(
        "/api/v1/streams/payments-agent/records", {"records": records}, format="json"
    )
    assert response.status_code == 200 and response.json()["accepted"] == len(records)
    with tenant_context(alice.tenant):
        assert Stream.objects.get(stream_id="payments-agent").length == len(records)
    # agent-saga's push attaches by linkage only within the key's tenant
    pushed = carol.key_client().post("/v1/wal/ingest", {"records": chain(saga_records())}, format="json")
    assert pushed.status_code == 200
    with tenant_context(carol.tenant):
        assert set(Stream.objects.values_list("stream_id", flat=True)) >= {"payments-agent"}
    assert len(alice.key_client().get("/api/v1/sagas").json()["results"]) == 1
