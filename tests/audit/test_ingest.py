"""POST /api/v1/streams/<id>/records: verified, whole-or-nothing, idempotent; every bad input of
issue 3 gets its specific error and leaves the store unchanged."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from django.test import override_settings
from sagaplane.chain import GAP_EVENT, GENESIS, redact_record, stamp, verify_chain

from audit import services
from audit.models import EquivocationAttempt, Record, RecordPayload, RefusedBatch, Stream, TenantLog
from core.scoping import tenant_context
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tests.support.chains import chain, restamp, saga_records, snapshot
from tests.support.factories import Person
from tests.support.scoping import in_tenant

URL = "/api/v1/streams/{}/records"


def post(person: Person, stream: str, records: Any) -> Any:
    return person.key_client().post(URL.format(stream), {"records": records}, format="json")


def test_accepts_a_chain_and_reports_the_head(alice: Person) -> None:
    records = chain(saga_records(steps=2))
    response = post(alice, "agent-1", records)
    assert response.status_code == 200, response.content
    assert response.json() == {
        "stream": "agent-1",
        "accepted": len(records),
        "duplicates": 0,
        "head": {"seq": records[-1]["seq"], "hash": records[-1]["_h"]},
    }
    detail = alice.key_client().get("/api/v1/streams/agent-1").json()
    assert detail["length"] == len(records) and detail["head"]["hash"] == records[-1]["_h"]
    with tenant_context(alice.tenant):
        stored = list(Record.objects.filter(stream__stream_id="agent-1").order_by("position"))
        assert [r.position for r in stored] == list(range(1, len(records) + 1))
        leaves = [r.leaf_index for r in stored]
        assert leaves == list(range(leaves[0], leaves[0] + len(records)))
        assert TenantLog.objects.get().size == Record.objects.count()
        # what is stored is what was sent, and it still verifies
        payload = RecordPayload.objects.get(record=stored[2])
        assert services.stored_record(stored[2], payload, None) == records[2]


def test_extends_across_batches_and_resend_is_idempotent(alice: Person) -> None:
    records = chain(saga_records(steps=3))
    assert post(alice, "s", records[:4]).json()["accepted"] == 4
    again = post(alice, "s", records[:6])
    assert again.status_code == 200
    assert again.json()["accepted"] == 2 and again.json()["duplicates"] == 4
    before = snapshot(alice.tenant)
    same = post(alice, "s", records)
    assert same.json()["duplicates"] == 6 and same.json()["accepted"] == len(records) - 6
    full = snapshot(alice.tenant)
    assert post(alice, "s", records).json() == {**same.json(), "accepted": 0, "duplicates": len(records)}
    assert snapshot(alice.tenant) == full != before
    # a re-send that starts in the middle of what is held
    assert post(alice, "s", records[3:5]).json()["duplicates"] == 2


def test_writer_restart_at_seq_1_is_the_next_record(alice: Person) -> None:
    first = chain(saga_records())
    second = chain(saga_records(), prev=first[-1]["_h"], seq=1)
    assert post(alice, "w", first).status_code == 200
    response = post(alice, "w", second)
    assert response.status_code == 200, response.content
    assert response.json()["head"] == {"seq": second[-1]["seq"], "hash": second[-1]["_h"]}
    assert verify_chain(first + second).intact


def test_redacted_stub_is_accepted(alice: Person) -> None:
    records = chain(saga_records())
    records[1] = redact_record(records[1], reason="gdpr")
    assert post(alice, "r", records).status_code == 200
    with tenant_context(alice.tenant):
        stub = Record.objects.get(stream__stream_id="r", position=2)
        assert stub.redacted == "gdpr" and not RecordPayload.objects.filter(record=stub).exists()


def test_redacted_stub_still_carrying_payload_is_refused(alice: Person) -> None:
    records = chain(saga_records())
    records[1]["_redacted"] = "pretend"
    response = post(alice, "r", records)
    assert response.status_code == 422
    assert response.json()["reason"] == "redacted_with_payload" and response.json()["index"] == 1


def test_attested_gap_of_records_never_shipped_is_accepted(alice: Person) -> None:
    records = chain(saga_records(steps=2))
    kept = records[:2] + records[4:]
    removed = [r["seq"] for r in records[2:4]]
    gap = {
        "event": GAP_EVENT,
        "ranges": [[removed[0], removed[-1]]],
        "removed": 2,
        "removed_digest": "ab" * 32,
        "reason": "compaction: 2 record(s) for settled sagas",
    }
    attestation = chain([gap], prev=kept[-1]["_h"], seq=kept[-1]["seq"] + 1)
    response = post(alice, "g", kept + attestation)
    assert response.status_code == 200, response.content
    assert response.json()["accepted"] == len(kept) + 1


def test_forged_gap_over_held_records_is_refused(alice: Person) -> None:
    records = chain(saga_records(steps=2))  # 6 records
    assert post(alice, "fg", records).status_code == 200
    before = snapshot(alice.tenant)
    # Pretend records 4..6 were compacted away and continue from record 3.
    forged = chain(saga_records(), prev=records[2]["_h"], seq=7)
    gap = {"event": GAP_EVENT, "ranges": [[4, 6]], "removed": 3, "removed_digest": "cd" * 32, "reason": "x"}
    forged += chain([gap], prev=forged[-1]["_h"], seq=forged[-1]["seq"] + 1)
    response = post(alice, "fg", forged)
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "chain_broken" and body["reason"] == "forged_gap"
    assert body["index"] == 0 and body["seq"] == 7
    assert snapshot(alice.tenant) == before


def test_unattested_gap_is_a_seq_gap(alice: Person) -> None:
    records = chain(saga_records(steps=2))
    response = post(alice, "sg", records[:2] + records[3:])
    assert response.status_code == 422
    assert response.json()["reason"] == "seq_gap" and response.json()["index"] == 2
    assert response.json()["seq"] == records[3]["seq"]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r[1].update(seq=2.0), "records[1].seq"),
        (lambda r: r[2].update(_h="zz" * 32), "records[2]._h"),
        (lambda r: r[0].pop("_cd"), "records[0]._cd"),
        (lambda r: r[1].pop("_ph"), "records[1]._ph"),
        (lambda r: r[1].update(ts="yesterday"), "records[1].ts"),
        (lambda r: r[3].pop("_s"), "records[3]._s"),
        (lambda r: r[0].update(event=None), "records[0].event"),
        (lambda r: r[2].update(saga_id=7), "records[2].saga_id"),
    ],
)
def test_wrong_types_are_400_with_the_field_named(alice: Person, mutate: Any, field: str) -> None:
    records = chain(saga_records())
    mutate(records)
    before = snapshot(alice.tenant)
    response = post(alice, "t", records)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert snapshot(alice.tenant) == before


def test_truncated_json_is_400(alice: Person) -> None:
    body = json.dumps({"records": chain(saga_records())})
    before = snapshot(alice.tenant)
    response = alice.key_client().post(
        URL.format("t"), body[: len(body) // 2], content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["error"] == "malformed_json" and response.json()["field"] == "body"
    assert snapshot(alice.tenant) == before


def test_records_missing_or_not_a_list_is_400(alice: Person) -> None:
    for body in ({}, {"records": "x"}, {"records": []}, [1, 2]):
        response = alice.key_client().post(URL.format("t"), body, format="json")
        assert response.status_code == 400
        assert response.json()["field"] in ("records", "body")


def test_batch_mixing_two_streams_breaks_at_the_second_genesis(alice: Person) -> None:
    before = snapshot(alice.tenant)
    mixed = chain(saga_records()) + chain(saga_records())
    response = post(alice, "m", mixed)
    # The SDK's verifier names the same record for the same reason (one chain walk).
    expected = verify_chain(mixed).first_break
    assert response.status_code == 422 and expected is not None
    body = response.json()
    assert (
        (body["reason"], body["index"]) == (expected.code, expected.index) == ("broken_link", len(mixed) // 2)
    )
    assert "genesis" in body["detail"]
    named = alice.key_client().post(
        URL.format("m"), {"stream": "other", "records": chain(saga_records())}, format="json"
    )
    assert named.status_code == 400 and named.json()["field"] == "stream"
    assert snapshot(alice.tenant) == before


def test_first_record_not_linking_to_the_head_is_broken_link(alice: Person) -> None:
    records = chain(saga_records(steps=2))
    assert post(alice, "b", records[:3]).status_code == 200
    before = snapshot(alice.tenant)
    stray = chain(saga_records(), prev="ab" * 32, seq=4)
    response = post(alice, "b", stray)
    assert response.status_code == 422
    body = response.json()
    assert body == {**body, "error": "chain_broken", "reason": "broken_link", "seq": 4, "index": 0}
    assert snapshot(alice.tenant) == before


def test_edited_field_is_digest_mismatch_with_first_bad_record(alice: Person) -> None:
    records = chain(saga_records(steps=2))
    records[3]["tool"] = "payments.steal"
    records[4]["tool"] = "payments.steal"
    before = snapshot(alice.tenant)
    response = post(alice, "e", records)
    assert response.status_code == 422
    assert response.json()["reason"] == "digest_mismatch"
    assert (response.json()["seq"], response.json()["index"]) == (records[3]["seq"], 3)
    assert snapshot(alice.tenant) == before


def test_a_chain_refusal_is_kept_as_evidence_without_its_records(alice: Person) -> None:
    records = chain(saga_records(steps=2))
    records[3]["tool"] = "payments.steal"
    response = post(alice, "ev", records)
    assert response.status_code == 422
    with tenant_context(alice.tenant):
        refusal = RefusedBatch.objects.get()
        assert not Record.objects.filter(stream__stream_id="ev").exists()
    assert (refusal.stream_id, refusal.code, refusal.status) == ("ev", "digest_mismatch", 422)
    assert (refusal.seq, refusal.index, refusal.record_count) == (str(records[3]["seq"]), 3, len(records))
    assert refusal.actor.startswith("api-key:")


def test_malformed_input_leaves_no_evidence_row(alice: Person) -> None:
    assert post(alice, "ev", [{"seq": 1.5}]).status_code == 400
    with tenant_context(alice.tenant):
        assert not RefusedBatch.objects.exists()


def test_edited_header_is_hash_mismatch(alice: Person) -> None:
    records = chain(saga_records())
    records[2]["ts"] += 1
    response = post(alice, "e", records)
    assert response.status_code == 422 and response.json()["reason"] == "hash_mismatch"
    assert response.json()["index"] == 2


def test_resent_batch_with_one_record_altered(alice: Person) -> None:
    records = chain(saga_records(steps=2))
    assert post(alice, "a", records).status_code == 200
    before = snapshot(alice.tenant)
    altered = copy.deepcopy(records)
    altered[2]["kwargs"] = {"amount": 10_000}
    response = post(alice, "a", altered)
    assert response.status_code == 422 and response.json()["reason"] == "digest_mismatch"
    assert response.json()["index"] == 2
    assert snapshot(alice.tenant) == before


def test_equivocation_is_409_and_kept_as_evidence(alice: Person) -> None:
    records = chain(saga_records(steps=2))
    assert post(alice, "q", records).status_code == 200
    before = snapshot(alice.tenant)
    # A well-formed, correctly chained different record at held position 3.
    forked = restamp(records, 2, records[1]["_h"])
    forked[2]["kwargs"] = {"amount": 99}
    forked = restamp(forked, 2, records[1]["_h"])
    response = post(alice, "q", forked)
    assert response.status_code == 409
    body = response.json()
    assert body["error"] == "equivocation" and body["reason"] == "equivocation"
    assert body["position"] == 3 and body["held_hash"] == records[2]["_h"] and body["index"] == 2
    assert snapshot(alice.tenant) == before
    with tenant_context(alice.tenant):
        evidence = EquivocationAttempt.objects.get()
        assert evidence.offered_hash == forked[2]["_h"] and evidence.stream_id == "q"
        assert RefusedBatch.objects.get().code == "equivocation"
        assert json.loads(evidence.offered_record)["kwargs"] == {"amount": 99}


def test_second_genesis_for_a_held_stream_is_equivocation(alice: Person) -> None:
    assert post(alice, "q2", chain(saga_records())).status_code == 200
    response = post(alice, "q2", chain(saga_records()))
    assert response.status_code == 409 and response.json()["position"] == 1


def test_too_many_records_is_413(alice: Person) -> None:
    records = chain(saga_records(steps=3))
    before = snapshot(alice.tenant)
    with override_settings(SAGAPLANE_MAX_BATCH_RECORDS=5):
        response = post(alice, "big", records)
    assert response.status_code == 413 and response.json()["error"] == "too_many_records"
    assert snapshot(alice.tenant) == before


def test_fifty_megabyte_body_is_413_before_reading(alice: Person) -> None:
    body = b'{"records": [' + b" " * (50 * 1024 * 1024) + b"]}"
    response = alice.key_client().post(URL.format("huge"), body, content_type="application/json")
    assert response.status_code == 413
    assert response.json()["error"] == "too_large"


def test_server_stream_is_not_writable_by_agents(alice: Person) -> None:
    records = chain(saga_records())
    response = post(alice, "server", records)
    assert response.status_code == 403 and response.json()["error"] == "reserved_stream"


def test_ingest_needs_the_ingest_scope_and_keys_only(alice: Person, tenant_a: Any) -> None:
    from tenants import services as tenant_services

    _, read_only = in_tenant(
        tenant_services.create_api_key,
        tenant_a,
        NewApiKey(name="ro", scopes=["read"]),
        actor=named_actor("test"),
    )
    client = alice.key_client()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {read_only}")
    assert client.post(URL.format("x"), {"records": chain(saga_records())}, format="json").status_code == 403
    assert (
        alice.session_client()
        .post(URL.format("x"), {"records": chain(saga_records())}, format="json")
        .status_code
        == 403
    )


def test_unknown_events_are_stored_and_verified(alice: Person) -> None:
    records = chain([{"event": "SOMETHING_NEW", "x": [1, 2.5, None, "é"]}, {"event": "ALSO_NEW"}])
    assert post(alice, "u", records).status_code == 200
    with tenant_context(alice.tenant):
        record = Record.objects.get(stream__stream_id="u", position=1)
        assert services.stored_record(record, record.payload, None) == records[0]


def test_integer_ts_round_trips_exactly(alice: Person) -> None:
    record = {"seq": 1, "event": "X", "ts": 1796000000}
    stamp(record, GENESIS)
    assert post(alice, "i", [record]).status_code == 200
    with tenant_context(alice.tenant):
        stored = Record.objects.get(stream__stream_id="i")
        assert services.stored_record(stored, stored.payload, None) == record
        assert Stream.objects.get(stream_id="i").head_hash == record["_h"]
