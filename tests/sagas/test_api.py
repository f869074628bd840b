"""GET /api/v1/sagas (filters, pagination) and /api/v1/sagas/<id> (steps, records, masked credentials)."""

from __future__ import annotations

from django.utils import timezone

from audit import services
from tenants.actors import named_actor
from tests.support.chains import chain, saga_records
from tests.support.factories import Person
from tests.support.scoping import in_tenant


def _seed(alice: Person) -> list[dict]:
    now = timezone.now().timestamp()
    bodies = (
        saga_records("d1", tool="mail.send")
        + saga_records("d2", outcome="rolled_back")
        + saga_records("d3", outcome="partial")
    )
    records = chain(bodies, ts=now - 3600)
    in_tenant(services.ingest, alice.tenant, "api", records, actor=named_actor("test"))
    return records


def test_list_filters_and_paginates(alice: Person, bob: Person) -> None:
    _seed(alice)
    client = alice.key_client()
    everything = client.get("/api/v1/sagas").json()
    assert len(everything["results"]) == 3 and {s["saga_id"] for s in everything["results"]} == {
        "d1",
        "d2",
        "d3",
    }
    assert [s["saga_id"] for s in client.get("/api/v1/sagas?status=rolled_back").json()["results"]] == ["d2"]
    assert [s["saga_id"] for s in client.get("/api/v1/sagas?tool=mail.send").json()["results"]] == ["d1"]
    page = client.get("/api/v1/sagas?limit=2").json()
    assert len(page["results"]) == 2 and page["next"]
    future = timezone.now().isoformat()
    assert client.get("/api/v1/sagas", {"since": future}).json()["results"] == []
    assert client.get("/api/v1/sagas?since=nonsense").status_code == 400
    assert client.get("/api/v1/sagas?status=bogus").json()["field"] == "status"
    # any member role may read
    assert len(bob.session_client().get("/api/v1/sagas").json()["results"]) == 3


def test_detail_has_steps_records_in_order_and_masked_credentials(alice: Person) -> None:
    records = _seed(alice)
    body = alice.key_client().get("/api/v1/sagas/d1").json()
    assert body["saga"]["status"] == "completed" and body["saga"]["name"] == "demo"
    step = body["steps"][0]
    assert step["status"] == "committed" and step["tool"] == "mail.send"
    kwargs = step["compensation"]["kwargs"]
    assert kwargs["charge_id"] == "ch_0"
    assert set(kwargs["api_key"]) == {"$credential"} and "sk_live" not in str(body)
    # A keyed reference, not a bare hash that a dictionary attack could invert offline.
    import hashlib
    import json

    assert kwargs["api_key"]["$credential"].startswith("hmac:")
    bare = hashlib.sha256(json.dumps("sk_live_abcdefghijkl").encode()).hexdigest()[:16]
    assert bare not in str(body)
    leaves = [r["leaf_index"] for r in body["records"]]
    assert leaves == sorted(leaves) and len(leaves) == 4
    assert [r["record"]["_h"] for r in body["records"]] == [r["_h"] for r in records[:4]]
    assert alice.key_client().get("/api/v1/sagas/nope").status_code == 404
