"""Issue 9, defects 2 and 3: every record that verifies under the chain rule is stored and served
exactly (NUL anywhere, NaN and Infinity in its values), and what cannot verify or exceeds the
documented limits (lone surrogates, nesting past 64, duplicate keys, a body nested ten thousand
deep) is a 400 that stores nothing -- never a 500, never a read that breaks afterwards.

Runs on whatever database the suite uses; on Postgres (which refuses NUL in text and jsonb, and
NaN in jsonb) it is the regression test for the 500s."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from sagaplane.chain import redact_record, verify_chain
from sagaplane.disclosure import verify_disclosure
from sagaplane.limits import MAX_NESTING
from sagaplane.wal import WAL, WALError

from audit import services as audit_services
from audit.models import Record, RecordPayload, Redaction, TenantLog
from core.scoping import tenant_context
from tenants.models import Tenant
from tests.support.chains import chain, snapshot
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.transparency import settle
from transparency import bundles

URL = "/api/v1/streams/{}/records"
NAN = float("nan")
INF = float("inf")


def post_text(person: Person, stream: str, body: str | bytes) -> Any:
    """POST a body exactly as given (the test client's JSON encoder would normalise it)."""
    return person.key_client().post(URL.format(stream), body, content_type="application/json")


def post(person: Person, stream: str, records: list[dict[str, Any]]) -> Any:
    # json.dumps writes NaN/Infinity as Python and agent-saga do (bare tokens) and escapes NUL.
    return post_text(person, stream, json.dumps({"records": records}))


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values, NaN included (NaN != NaN in Python), 1 and 1.0 told apart."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def strict_json(content: bytes) -> Any:
    """Parse as strict JSON (Python's parser would take NaN/Infinity tokens; a browser's would not)."""

    def refuse(token: str) -> None:
        raise AssertionError(f"not strict JSON: {token}")

    return json.loads(content, parse_constant=refuse)


def served_record(entry: dict[str, Any]) -> Any:
    """A served record entry's record exactly: `record_json` when present, else `record`."""
    return json.loads(entry["record_json"]) if "record_json" in entry else entry["record"]


def stored(tenant: Tenant, stream: str) -> list[dict[str, Any]]:
    with tenant_context(tenant):
        rows = list(Record.objects.filter(stream__stream_id=stream).order_by("position"))
        payloads = {p.record_id: p for p in RecordPayload.objects.filter(record__in=rows)}
        erased = dict(Redaction.objects.values_list("record_id", "reason"))
        return [audit_services.stored_record(r, payloads.get(r.pk), erased.get(r.pk)) for r in rows]


def exported(tenant: Tenant) -> list[dict[str, Any]]:
    """records.ndjson of an export of the whole log, as the export task writes it."""
    with tenant_context(tenant):
        end = TenantLog.objects.get().size
    out = io.BytesIO()
    bundles.write_records(
        0,
        end,
        out,
        lambda done: None,
        lambda start, stop: in_tenant(bundles.records_chunk, tenant, start, stop),
    )
    return [json.loads(line) for line in out.getvalue().splitlines()]


def page(person: Person, name: str, saga_id: str) -> int:
    client = Client()
    client.force_login(person.user)
    return client.get(reverse(name, args=[saga_id])).status_code


def test_records_with_nul_that_the_sdk_writes_are_stored_and_served_exactly(
    tenant_a: Tenant, alice: Person, tmp_path: Path
) -> None:
    saga_id = "bad\x00saga"
    wal = WAL(tmp_path / "agent.wal")
    fields = {"saga_id": saga_id, "name": "bad\x00name", "lease_ttl": 5.0}
    wal.append("SAGA_START", fields)
    step = {"saga_id": saga_id, "step_id": "st\x00ep", "tool": "pay\x00ments"}
    wal.append("STEP_INTENT", {**step, "kwargs": {"k\x00ey": ["v\x00al", {"\x00": 0}]}})
    wal.append(
        "STEP_COMMITTED",
        {
            **step,
            "compensation": {"handler": "re\x00fund", "kwargs": {"id\x00": "x\x00"}, "recoverable": True},
        },
    )
    wal.append("CUSTOM\x00EVENT", {"saga_id": saga_id})
    wal.append("SAGA_COMPLETE", {"saga_id": saga_id})
    wal.close()
    records = [json.loads(line) for line in (tmp_path / "agent.wal").read_bytes().splitlines()]
    assert verify_chain(records).intact  # the SDK's own verifier accepts what its writer wrote
    # A redacted stub whose reason holds a NUL (the reason is outside the hash: it still verifies).
    records[3] = redact_record(records[3], reason="gdpr\x00erasure")
    assert verify_chain(records).intact

    response = post(alice, "nul-stream", records)
    assert response.status_code == 200, response.content
    assert response.json()["accepted"] == len(records)
    assert [same(s, r) for s, r in zip(stored(tenant_a, "nul-stream"), records, strict=True)] == [True] * 5

    # The saga is found by its index id (NUL -> U+FFFD) and serves the exact records.
    index_id = "bad\ufffdsaga"
    detail = alice.key_client().get(f"/api/v1/sagas/{index_id}")
    assert detail.status_code == 200, detail.content
    body = detail.json()
    assert body["saga"]["name"] == "bad\ufffdname" and body["saga"]["status"] == "completed"
    assert [s["step_id"] for s in body["steps"]] == ["st\ufffdep"]
    in_saga = [r for r in records if "_redacted" not in r]  # a stub carries no saga_id
    assert [served_record(e) for e in body["records"]] == in_saga
    assert page(alice, "saga-detail", index_id) == 200
    assert page(alice, "saga-timeline", index_id) == 200

    settle(tenant_a)
    disclosure = alice.key_client().get(f"/api/v1/audit/sagas/{index_id}/disclosure")
    assert disclosure.status_code == 200, disclosure.content
    bundle = disclosure.json()
    assert bundle["saga_id"] == saga_id  # the exact id, as every record carries it
    assert [served_record(e) for e in bundle["records"]] == in_saga
    key = alice.key_client().get("/api/v1/audit/key").content.decode().splitlines()[0]
    assert verify_disclosure(bundle, key).records == len(in_saga)
    lines = [line["record"] for line in exported(tenant_a) if line["stream"] == "nul-stream"]
    assert lines == records


def test_nan_and_infinity_are_stored_and_every_read_still_answers(tenant_a: Tenant, alice: Person) -> None:
    saga_id = "nan-saga"
    compensation = {"handler": "refund", "kwargs": {"amount": NAN, "cap": INF}, "recoverable": True}
    records = chain(
        [
            {"event": "SAGA_START", "saga_id": saga_id, "name": "n", "lease_ttl": INF},
            {"event": "STEP_INTENT", "saga_id": saga_id, "step_id": "s", "tool": "t", "kwargs": {"x": NAN}},
            {
                "event": "STEP_COMMITTED",
                "saga_id": saga_id,
                "step_id": "s",
                "tool": "t",
                "kwargs": {"y": [INF, -INF, 1e308, -0.0, 10**300]},
                "compensation": compensation,
            },
            {"event": "SAGA_COMPLETE", "saga_id": saga_id},
        ]
    )
    assert verify_chain(records).intact  # NaN and Infinity are valid under the chain rule
    response = post(alice, "nan-stream", records)
    assert response.status_code == 200, response.content
    assert [same(s, r) for s, r in zip(stored(tenant_a, "nan-stream"), records, strict=True)] == [True] * 4

    detail = alice.key_client().get(f"/api/v1/sagas/{saga_id}")
    assert detail.status_code == 200, detail.content
    body = strict_json(detail.content)
    entries = body["records"]
    assert entries[0]["record"]["lease_ttl"] == "Infinity" and "record_json" in entries[0]
    assert "record_json" not in entries[3]  # only records strict JSON cannot carry have one
    assert all(same(served_record(e), r) for e, r in zip(entries, records, strict=True))
    assert entries[1]["record"]["kwargs"] == {"x": "NaN"}  # the strict-JSON view names the number
    assert body["saga"]["lease_ttl"] is None  # an infinite lease is no lease
    assert body["steps"][0]["compensation"]["kwargs"] == {"amount": "NaN", "cap": "Infinity"}
    assert page(alice, "saga-detail", saga_id) == 200
    assert page(alice, "saga-timeline", saga_id) == 200

    settle(tenant_a)
    disclosure = alice.key_client().get(f"/api/v1/audit/sagas/{saga_id}/disclosure")
    assert disclosure.status_code == 200, disclosure.content
    bundle = strict_json(disclosure.content)
    assert all(same(served_record(e), r) for e, r in zip(bundle["records"], records, strict=True))
    key = alice.key_client().get("/api/v1/audit/key").content.decode().splitlines()[0]
    assert verify_disclosure(bundle, key).records == len(records)
    lines = [line["record"] for line in exported(tenant_a) if line["stream"] == "nan-stream"]
    assert same(lines, records)


def nested(levels: int) -> Any:
    """A value `levels` deep (a list counts one level)."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def test_nesting_past_the_limit_is_refused_by_ingest_and_by_the_sdk_writer(
    tenant_a: Tenant, alice: Person, tmp_path: Path
) -> None:
    # The record is level 1, so its kwargs may be MAX_NESTING - 1 deep.
    deepest = chain([{"event": "E", "saga_id": "deep", "kwargs": nested(MAX_NESTING - 1)}])
    response = post(alice, "deep-ok", deepest)
    assert response.status_code == 200, response.content
    assert alice.key_client().get("/api/v1/sagas/deep").status_code == 200
    assert page(alice, "saga-timeline", "deep") == 200

    before = snapshot(tenant_a)
    (record,) = chain([{"event": "E", "saga_id": "deep-no", "kwargs": "HERE"}])
    for levels in (MAX_NESTING, 900):
        # Built as text: the test's own encoder would recurse 900 deep. Refused before any hash check.
        body = json.dumps({"records": [record]}).replace('"HERE"', "[" * levels + "1" + "]" * levels)
        response = post_text(alice, "deep-no", body)
        assert response.status_code == 400, response.content
        assert response.json()["error"] == "too_deep"
        # Past the parser's own recursion depth the body is refused before records are looked at.
        assert response.json()["field"] == "records[0]" or levels > MAX_NESTING
    assert snapshot(tenant_a) == before

    # The SDK writer refuses the same record before it reaches the WAL (nothing is written).
    wal = WAL(tmp_path / "deep.wal")
    wal.append("E", {"kwargs": nested(MAX_NESTING - 1)})
    with pytest.raises(WALError, match="nest deeper than 64"):
        wal.append("E", {"kwargs": nested(MAX_NESTING)})
    with pytest.raises(WALError, match="nest deeper than 64"):
        wal.append("E", {"kwargs": nested(5000)})
    wal.close()
    assert len((tmp_path / "deep.wal").read_bytes().splitlines()) == 1


def test_a_body_of_ten_thousand_brackets_is_a_400(tenant_a: Tenant, alice: Person) -> None:
    before = snapshot(tenant_a)
    for body in ("[" * 10_000, '{"records": ' + "[" * 10_000 + "]" * 10_000 + "}"):
        response = post_text(alice, "brackets", body)
        assert response.status_code == 400, response.content
        assert response.json()["error"] in ("too_deep", "malformed_json")
    assert snapshot(tenant_a) == before


def test_duplicate_keys_are_refused(tenant_a: Tenant, alice: Person) -> None:
    (record,) = chain([{"event": "E", "saga_id": "dup", "amount": 1}])
    text = json.dumps({"records": [record]})
    before = snapshot(tenant_a)
    # The hash covers amount=1; a reader that keeps the last key would see 2.
    forged = text.replace('"amount": 1', '"amount": 1, "amount": 2')
    nested_dup = text.replace('"amount": 1', '"amount": {"a": 1, "a": 1}')
    for body in (forged, nested_dup, text.replace('{"records"', '{"records": [], "records"')):
        response = post_text(alice, "dup", body)
        assert response.status_code == 400, response.content
        assert response.json()["error"] == "duplicate_key" and response.json()["field"] == "body"
    assert snapshot(tenant_a) == before
    assert post_text(alice, "dup", text).status_code == 200


def test_lone_surrogates_cannot_be_chained_so_they_are_refused(
    tenant_a: Tenant, alice: Person, tmp_path: Path
) -> None:
    (record,) = chain([{"event": "E", "saga_id": "sur", "kwargs": {"a": "x"}}])
    text = json.dumps({"records": [record]})
    before = snapshot(tenant_a)
    bodies = [
        text.replace('"a": "x"', '"a": "\\ud800"'),  # in a value
        text.replace('"a": "x"', '"\\udfff": "x"'),  # in a key
        text.replace('"saga_id": "sur"', '"saga_id": "s\\ud800"'),  # in an id
        json.dumps({"records": [redact_record(record, reason="r")]}).replace('"r"', '"\\ud800"'),
    ]
    for body in bodies:
        response = post_text(alice, "sur", body)
        assert response.status_code == 400, response.content
        assert response.json()["error"] == "unencodable"
    assert snapshot(tenant_a) == before
    # No writer can chain one: the SDK refuses it, and its verifier does not accept one.
    wal = WAL(tmp_path / "s.wal")
    with pytest.raises(WALError, match="UTF-8"):
        wal.append("E", {"kwargs": {"a": "\ud800"}})
    wal.close()
    assert not verify_chain([json.loads(bodies[0])["records"][0]]).intact
    # A surrogate pair is one ordinary character (U+1F600), stored and served exactly.
    (emoji,) = chain([{"event": "E", "saga_id": "smile", "kwargs": {"a": "\U0001f600"}}])
    assert post_text(alice, "ok", json.dumps({"records": [emoji]})).status_code == 200
    assert stored(tenant_a, "ok") == [emoji]
