"""The ingest request does a fixed number of queries, whatever the batch size: set-based writes
(audit.bulk, sagas.bulk), no per-record or per-saga query (an N+1 would make large batches slow)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import Record, RecordPayload, Stream
from sagas.models import Saga, Step
from tenants.scoping import tenant_context
from tests.audit.chains import chain, saga_records
from tests.conftest import Person

URL = "/api/v1/streams/{}/records"
# Auth, tenant settings and savepoints, stream and log locks, ids+payloads, headers, stream head,
# log size, sagas, steps, projection upsert: well under this, and the same for 1 or 1000 records.
MAX_QUERIES = 30


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
    return len(queries.captured_queries)


@pytest.mark.postgres
def test_queries_per_batch_are_bounded_and_independent_of_batch_size(alice: Person) -> None:
    _post(alice, "warm-up", _records(1))  # one-time work: the tenant's log row, cached names
    counts: dict[int, tuple[int, int]] = {}
    for sagas in (2, 60):
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
        assert Record.objects.filter(stream__in=agent).count() == 6 + 12 + 360
        assert RecordPayload.objects.filter(record__stream__in=agent).count() == 6 + 12 + 360
        assert list(agent.order_by("stream_id").values_list("length", flat=True)) == [12, 360, 6]
        assert Saga.objects.filter(status="completed").count() == 63
        assert Step.objects.filter(status="committed").count() == 126
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
