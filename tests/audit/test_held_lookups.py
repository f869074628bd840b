"""Finding held records by hash: re-sent batches, agent-saga's attach, redaction by hash.

Records are found by hash through the (leaf block, tenant, h) index, one probe per block of
2**LEAF_BLOCK_BITS leaves, so these tests place a stream across a block boundary (the tenant's log
is moved on to just before one) and look up records on both sides of it after the stream moved on."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from audit import services
from audit.models import LEAF_BLOCK_BITS, Record, Redaction, Stream, TenantLog, leaf_blocks
from core.scoping import tenant_context
from tenants.actors import named_actor
from tests.support.chains import chain, saga_records
from tests.support.factories import Person
from tests.support.scoping import in_tenant

BOUNDARY = 1 << LEAF_BLOCK_BITS


def _across_a_block_boundary(person: Person, stream_id: str) -> list[dict[str, Any]]:
    """A stream of 14 records whose leaves are BOUNDARY-6 .. BOUNDARY+7, then another stream
    appended after it (so none of these records is a head any more)."""
    in_tenant(services.ingest, person.tenant, "first", chain(saga_records()), actor=named_actor("test"))
    with tenant_context(person.tenant):
        TenantLog.objects.update(size=BOUNDARY - 6)  # as if 65,530 leaves were held already
    records = chain(saga_records(steps=6))
    assert len(records) == 14
    in_tenant(services.ingest, person.tenant, stream_id, records[:8], actor=named_actor("test"))
    in_tenant(services.ingest, person.tenant, stream_id, records[8:], actor=named_actor("test"))
    in_tenant(services.ingest, person.tenant, "later", chain(saga_records()), actor=named_actor("test"))
    with tenant_context(person.tenant):
        leaves = list(
            Record.objects.filter(stream__stream_id=stream_id)
            .order_by("position")
            .values_list("leaf_index", flat=True)
        )
    assert leaves == list(range(BOUNDARY - 6, BOUNDARY + 8))
    return records


def test_leaf_blocks_cover_both_ends() -> None:
    assert leaf_blocks(0, 0) == [0]
    assert leaf_blocks(BOUNDARY - 1, BOUNDARY) == [0, 1]
    assert leaf_blocks(3 * BOUNDARY + 5, 5 * BOUNDARY) == [3, 4, 5]


@pytest.mark.parametrize("window", [(1, 4), (5, 9), (9, 12)], ids=["before", "across", "after"])
def test_a_resent_batch_after_the_stream_moved_on_is_all_duplicates(
    alice: Person, window: tuple[int, int]
) -> None:
    records = _across_a_block_boundary(alice, "s")
    start, end = window
    result = in_tenant(services.ingest, alice.tenant, "s", records[start:end], actor=named_actor("test"))
    assert (result.accepted, result.duplicates) == (0, end - start)
    # and a re-send that runs past the head appends only what is new
    more = chain(saga_records(), prev=records[-1]["_h"], seq=records[-1]["seq"] + 1)
    result = in_tenant(services.ingest, alice.tenant, "s", records[start:] + more, actor=named_actor("test"))
    assert (result.accepted, result.duplicates) == (len(more), len(records) - start)


def test_a_different_record_in_a_resent_batch_is_equivocation(alice: Person) -> None:
    records = _across_a_block_boundary(alice, "q")
    forked = chain(saga_records(), prev=records[6]["_h"], seq=records[7]["seq"])
    with pytest.raises(services.IngestRefused) as refused:
        in_tenant(services.ingest, alice.tenant, "q", records[4:7] + forked, actor=named_actor("test"))
    assert refused.value.code == "equivocation"
    assert refused.value.extra["position"] == 8 and refused.value.extra["held_hash"] == records[7]["_h"]


@pytest.mark.parametrize("start", [2, 6, 10], ids=["before", "at", "after"])
def test_agent_saga_push_of_an_old_segment_attaches_to_its_stream(alice: Person, start: int) -> None:
    records = _across_a_block_boundary(alice, "agent-x")
    results = in_tenant(
        services.ingest_by_linkage, alice.tenant, records[start : start + 3], actor=named_actor("test")
    )
    assert [(r.stream_id, r.accepted, r.duplicates) for r in results] == [("agent-x", 0, 3)]
    # its chain's first record, pushed again, is found through the index of first records
    results = in_tenant(services.ingest_by_linkage, alice.tenant, records[:2], actor=named_actor("test"))
    assert [(r.stream_id, r.duplicates) for r in results] == [("agent-x", 2)]
    with tenant_context(alice.tenant):
        assert not Stream.objects.filter(stream_id__startswith="as-").exists()


@pytest.mark.parametrize("position", [2, 6, 7, 13])
def test_redaction_by_hash_finds_the_record_on_either_side(alice: Person, position: int) -> None:
    records = _across_a_block_boundary(alice, "r")
    with tenant_context(alice.tenant):
        redaction = services.redact(
            alice.tenant,
            "r",
            record_hash_=records[position - 1]["_h"],
            reason="GDPR",
            actor=named_actor("test"),
        )
        assert redaction.record.position == position
        # another stream's record, by its hash, is not this stream's
        other = Record.objects.filter(stream__stream_id="later").values_list("h", flat=True).first()
        assert other is not None
        with pytest.raises(services.IngestRefused) as refused:
            services.redact(alice.tenant, "r", record_hash_=other, reason="GDPR", actor=named_actor("test"))
    assert refused.value.status == 404
    with tenant_context(alice.tenant):
        assert Redaction.objects.count() == 1


@pytest.mark.postgres
def test_lookups_by_hash_can_be_probes_of_the_block_index(alice: Person) -> None:
    """Under row-level security Postgres makes a condition an index condition only if its
    functions are leakproof; `(leaf_index >> 16) = ANY(...)` is not (`>>` is not leakproof), so
    it could only ever filter every entry of the tenant. The lookup's conditions are plain
    equality on the index's own columns, the block leading (on 2M records the plan is one probe
    per block: docs/SCALING.md; on a test's few rows the planner may as well read them all)."""
    records = _across_a_block_boundary(alice, "p")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_indexdef('audit_record_hash_in_block'::regclass)")
        definition = cursor.fetchone()[0]
        cursor.execute(
            "SELECT generation_expression FROM information_schema.columns"
            " WHERE table_name = 'audit_record' AND column_name = 'leaf_block'"
        )
        generated = cursor.fetchone()[0]
    assert definition.endswith("USING btree (leaf_block, tenant_id, h)"), definition
    assert generated == f"(leaf_index >> {LEAF_BLOCK_BITS})", generated
    with tenant_context(alice.tenant):
        rows = services.held_by_hash(Record.objects.all(), records[3]["_h"])
        sql, _ = rows.query.sql_with_params()
        assert '"audit_record"."leaf_block" IN (' in sql and '"audit_record"."h" = ' in sql, sql
        assert [r.position for r in rows] == [4]
        first = Record.objects.filter(h=records[0]["_h"], position=1)
        sql, _ = first.query.sql_with_params()
        # The query carries the partial index's predicate and its key (whether a test's handful
        # of rows is read by it is the planner's choice, not the schema's).
        assert '"audit_record"."position" = ' in sql and '"audit_record"."h" = ' in sql, sql
        assert [r.position for r in first] == [1]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_indexdef('audit_record_first_hash'::regclass)")
        partial = cursor.fetchone()[0]
    assert partial.endswith('USING btree (tenant_id, h) WHERE ("position" = 1)'), partial
