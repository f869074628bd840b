"""agent-saga users point SagaCloudClient at Sagaplane: real WALs written by agent-saga in the
test, pushed by the real client to a live server, verified; tampered copies refused naming the
same first bad record as agent-saga's own integrity.verify."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import urllib.error
from pathlib import Path
from typing import Any

import pytest
from agent_saga import SagaAborted, compensator, integrity, saga_scope, tool
from agent_saga.cloud import SagaCloudClient
from agent_saga.semantics import ActionSemantics as S
from agent_saga.semantics import Compensation
from agent_saga.wal import FileWAL

from audit.models import Record, Stream
from core.scoping import tenant_context
from sagas.models import Saga, SagaStatus
from tests.support.factories import Person

pytestmark = pytest.mark.django_db(transaction=True)


@compensator("sagaplane_interop.refund")
def _refund(charge_id: str, idempotency_key: str | None = None) -> None:
    return None


@tool(
    semantics=S.COMPENSABLE,
    compensate=lambda r: Compensation(
        fn=_refund, kwargs={"charge_id": r["id"]}, handler="sagaplane_interop.refund", description="refund"
    ),
)
def _charge(amount: int) -> dict[str, Any]:
    return {"id": f"ch_{amount}"}


@tool(semantics=S.COMPENSABLE, compensate=lambda r: Compensation(fn=lambda: None))
def _closure_only(x: int) -> int:
    return x


async def _write(path: Path) -> dict[str, str]:
    """One WAL: a clean saga, a rolled-back one, five concurrent ones; then the writer restarts."""
    wal = FileWAL(str(path))
    await wal.start()
    async with saga_scope(name="clean", wal=wal):
        await _charge(amount=10)
    try:
        async with saga_scope(name="rolled", wal=wal):
            await _charge(amount=20)
            await _closure_only(x=1)
            raise RuntimeError("boom")
    except SagaAborted as aborted:
        assert aborted.report.clean

    async def one(i: int) -> None:
        async with saga_scope(name=f"c{i}", wal=wal):
            await _charge(amount=100 + i)

    await asyncio.gather(*(one(i) for i in range(5)))
    await wal.close()
    wal = FileWAL(str(path))
    await wal.start()
    async with saga_scope(name="after-restart", wal=wal):
        await _charge(amount=99)
    await wal.close()
    return {}


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def wal_records(tmp_path: Path) -> list[dict[str, Any]]:
    os.environ.pop("AGENT_SAGA_WAL_KEY", None)
    path = tmp_path / "agent.wal"
    asyncio.run(_write(path))
    records = _records(path)
    assert integrity.verify(records).intact
    seqs = [r["seq"] for r in records]
    assert seqs.count(1) == 2, "the reopened writer restarted seq at 1"
    return records


def _client(live_server: Any, person: Person) -> SagaCloudClient:
    return SagaCloudClient(api_key=person.api_key, endpoint=f"{live_server.url}/v1", raise_on_error=True)


def _push(live_server: Any, person: Person, records: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    try:
        return 200, asyncio.run(_client(live_server, person).push_wal_records(records))
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_real_wal_pushed_by_the_real_client_is_verified_and_projected(
    live_server: Any, alice: Person, wal_records: list[dict[str, Any]]
) -> None:
    # A redacted record (GDPR erasure done by agent-saga itself) still verifies.
    records = copy.deepcopy(wal_records)
    records[1] = integrity.redact_record(records[1], reason="erasure-request")  # a STEP_INTENT
    assert integrity.verify(records).intact
    status, body = _push(live_server, alice, records[:10])
    assert status == 200 and body == {**body, "status": "accepted", "records_ingested": 10}
    status, body = _push(live_server, alice, records)  # a re-push of everything: only the rest is new
    assert status == 200
    assert body["records_ingested"] == len(records) - 10 and body["duplicates"] == 10
    with tenant_context(alice.tenant):
        stream = Stream.objects.get(kind="agent")
        assert stream.stream_id == f"as-{records[0]['_h'][:16]}"
        assert stream.length == len(records) and stream.head_hash == records[-1]["_h"]
        assert Record.objects.filter(stream=stream).exclude(redacted="").count() == 1
        sagas = {s.name: s for s in Saga.objects.all()}
        assert sagas["clean"].status == SagaStatus.COMPLETED
        assert sagas["rolled"].status == SagaStatus.ROLLED_BACK
        assert sagas["after-restart"].status == SagaStatus.COMPLETED
        assert {f"c{i}" for i in range(5)} <= set(sagas)
        assert all(s.lease_ttl == 5.0 for s in sagas.values())
    # visible per saga through the read API
    listing = alice.key_client().get("/api/v1/sagas?status=rolled_back").json()
    assert [s["name"] for s in listing["results"]] == ["rolled"]


def _edit(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(records)
    target = next(i for i, r in enumerate(out) if r["event"] == "STEP_INTENT" and i > 5)
    out[target]["kwargs"] = {"amount": 1_000_000}
    return out


def _reorder(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(records)
    out[7], out[8] = out[8], out[7]
    return out


def _delete(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return copy.deepcopy(records[:9] + records[10:])


def _duplicate(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return copy.deepcopy(records[:6] + [records[5]] + records[6:])


@pytest.mark.parametrize("tamper", [_edit, _reorder, _delete, _duplicate])
@pytest.mark.parametrize("clean_first", [False, True], ids=["fresh", "after-clean-push"])
def test_tampered_copies_are_refused_at_agent_sagas_first_bad_record(
    live_server: Any, alice: Person, wal_records: list[dict[str, Any]], tamper: Any, clean_first: bool
) -> None:
    if clean_first:
        assert _push(live_server, alice, wal_records)[0] == 200
    tampered = tamper(wal_records)
    report = integrity.verify(tampered)
    assert not report.intact
    first = report.breaks[0]
    with tenant_context(alice.tenant):
        before = list(Record.objects.values_list("pk", flat=True))
    status, body = _push(live_server, alice, tampered)
    assert status in (409, 422), body
    assert (body["seq"], body["index"]) == (first.seq, first.index), (body, str(first))
    with tenant_context(alice.tenant):
        assert list(Record.objects.values_list("pk", flat=True)) == before


def test_compat_reads_answer_in_the_clients_shapes(
    live_server: Any, alice: Person, wal_records: list[dict[str, Any]]
) -> None:
    client = _client(live_server, alice)
    assert _push(live_server, alice, wal_records)[0] == 200
    assert asyncio.run(client.pull_approvals(status="pending")) == []
    budget = asyncio.run(client.get_fleet_budget(window=60))
    assert budget["status"] == "ok" and budget["sagas"][SagaStatus.COMPLETED] >= 7
    report = asyncio.run(client.get_audit_report("2020-01-01T00:00:00", "2999-01-01T00:00:00"))
    with tenant_context(alice.tenant):
        server_records = Record.objects.filter(stream__kind="server").count()
    assert report["records"] == len(wal_records) + server_records and report["status"] == "ready"
