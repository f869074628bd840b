"""The ingest request does a fixed number of queries, whatever the batch size: set-based writes
(audit.queries, sagas.queries), no per-record or per-saga query (an N+1 would make large batches slow)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import Record, RecordPayload, Stream
from core.scoping import tenant_context
from sagas.models import Saga, Step
from tenants.actors import named_actor
from tests.support.chains import chain, saga_records
from tests.support.factories import Person

URL = "/api/v1/streams/{}/records"
# Auth, tenant settings and savepoints, stream and log locks, ids+payloads, headers, stream head,
# log size, sagas, steps, projection upsert: well under this, and the same for 1 or 1000 records.
MAX_QUERIES = 30
# The API key's row is read again once the process' checked copy is older than its epoch bound
# (tenants.authentication): whether a request pays that read depends on the time since the last
# one, not on the batch, so it is left out of the count.
KEY_LOOKUP = "sagaplane_api_key_auth"


def _records(sagas: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(sagas):
        out += saga_records(steps=2)  # 6 records: start, 2 x (intent, committed), complete
    return chain(out)


def _post(person: Person, stream: str, records: list[dict[str, Any]]) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = person.key_client().post(URL.format(stream), {"records": records}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["accepted"] == len(records)
    return sum(KEY_LOOKUP not in query["sql"] for query in queries.captured_queries)


@pytest.mark.postgres
def test_queries_per_batch_are_bounded_and_independent_of_batch_size(alice: Person) -> None:
    _post(alice, "warm-up", _records(1))  # one-time work: the tenant's log row, cached names
    counts: dict[int, tuple[int, int]] = {}
    # Three sagas at least: each second batch then both updates a held saga and starts a new one
    # (the recovery lease hook writes new leases and updates held ones: one statement each).
    for sagas in (3, 60):
        records = _records(sagas)
        # Split inside a saga (and inside a step), so the second batch updates held sagas and
        # steps as well as creating new ones.
        cut = len(records) // 2 + 2
        first = _post(alice, f"q-{sagas}", records[:cut])
        second = _post(alice, f"q-{sagas}", records[cut:])
        counts[len(records)] = (first, second)
    small, large = counts.values()
    assert small == large, f"query count depends on batch size: {counts}"
    assert max(small) <= MAX_QUERIES, counts

    with tenant_context(alice.tenant):
        # ... and everything was written: headers, payloads, the projection.
        agent = Stream.objects.filter(kind="agent")
        assert Record.objects.filter(stream__in=agent).count() == 6 + 18 + 360
        assert RecordPayload.objects.filter(record__stream__in=agent).count() == 6 + 18 + 360
        assert list(agent.order_by("stream_id").values_list("length", flat=True)) == [18, 360, 6]
        assert Saga.objects.filter(status="completed").count() == 64
        assert Step.objects.filter(status="committed").count() == 128
        leaves = sorted(Record.objects.values_list("leaf_index", flat=True))
        assert leaves == list(range(len(leaves)))


@pytest.mark.parametrize("cut", [1, 3, 4, 6])
def test_projection_carried_across_batches_equals_one_batch(alice: Person, cut: int) -> None:
    """What the set-based path reads back (steps' compensation JSON, times, counters) folds on
    exactly as if the whole saga had arrived in one batch."""
    from sagas import services as sagas_services

    records = chain(saga_records(steps=2, outcome="rolled_back"))
    _post(alice, "split", records[:cut])
    _post(alice, "split", records[cut:])

    def dump() -> tuple[Any, ...]:
        saga = Saga.objects.values().get()
        steps = list(Step.objects.order_by("ordinal").values())
        saga.pop("id")
        for step in steps:
            step.pop("id"), step.pop("saga_id")
        return saga, steps

    with tenant_context(alice.tenant):
        incremental = dump()
        assert incremental[0]["status"] == "rolled_back"
        assert all(isinstance(s["compensation"], dict) for s in incremental[1])
        assert [s["status"] for s in incremental[1]] == ["compensated", "compensated"]
        sagas_services.rebuild_tenant(alice.tenant)
        assert dump() == incremental


@pytest.mark.postgres
def test_saga_changed_between_early_fold_and_lock_is_folded_again(
    alice: Person, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On Postgres the projection is folded before the tenant log lock and written under it only if
    the sagas it read are unchanged; here another writer (a server record for the same saga) gets
    in between, so the batch must be folded again from what is stored then."""
    from audit import services as audit_services
    from sagas import services as sagas_services

    records = chain(saga_records(steps=2))
    saga_id = records[0]["saga_id"]
    _post(alice, "race", records[:2])
    original = sagas_services.prepare_records

    interfered: list[bool] = []

    def fold_then_interfere(tenant: Any, items: Any) -> Any:
        fold = original(tenant, items)
        if not interfered:
            interfered.append(True)
            audit_services.append_server_record(
                tenant, "APPROVAL_GRANTED", {"saga_id": saga_id}, actor=named_actor("t")
            )
        return fold

    monkeypatch.setattr(sagas_services, "prepare_records", fold_then_interfere)
    with caplog.at_level("INFO", logger="sagas.services"):
        _post(alice, "race", records[2:])
    assert "folding again" in caplog.text

    with tenant_context(alice.tenant):
        saga = Saga.objects.get(saga_id=saga_id)
        assert saga.record_count == len(records) + 1 and saga.status == "completed"
        assert saga.last_leaf_index == max(Record.objects.values_list("leaf_index", flat=True))
        incremental = (
            list(
                Saga.objects.values(
                    "saga_id", "status", "record_count", "first_leaf_index", "last_leaf_index"
                )
            ),
            list(
                Step.objects.order_by("ordinal").values(
                    "step_id", "status", "compensation", "last_leaf_index"
                )
            ),
        )
        sagas_services.rebuild_tenant(alice.tenant)
        assert (
            list(
                Saga.objects.values(
                    "saga_id", "status", "record_count", "first_leaf_index", "last_leaf_index"
                )
            ),
            list(
                Step.objects.order_by("ordinal").values(
                    "step_id", "status", "compensation", "last_leaf_index"
                )
            ),
        ) == incremental
