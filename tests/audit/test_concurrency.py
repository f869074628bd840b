"""Two requests extending the same stream at once never both succeed with different records."""

from __future__ import annotations

from typing import Any

import pytest

from audit import services
from audit.models import Record, Stream, TenantLog
from core.scoping import tenant_context
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.chains import chain, saga_records
from tests.support.concurrency import at_once
from tests.support.scoping import in_tenant

pytestmark = [pytest.mark.postgres]


def _race(tenant: Tenant, batches: list[list[dict[str, Any]]], stream_id: str) -> list[Any]:
    """Each batch sent at once: what each ingest returned or raised (IngestRefused), in order."""
    return at_once(
        lambda batch: in_tenant(services.ingest, tenant, stream_id, batch, actor=named_actor("test")), batches
    )


@pytest.mark.parametrize("round_", range(3))
def test_different_first_batches_race_exactly_one_wins(
    transactional_db: None, tenant_a: Tenant, round_: int
) -> None:
    batches = [chain(saga_records(steps=2)) for _ in range(2)]
    outcomes = _race(tenant_a, batches, f"race-{round_}")
    won = [o for o in outcomes if isinstance(o, services.IngestResult)]
    lost = [o for o in outcomes if isinstance(o, services.IngestRefused)]
    assert len(won) == 1 and len(lost) == 1
    assert lost[0].code == "equivocation" and lost[0].status == 409
    winner = batches[outcomes.index(won[0])]
    with tenant_context(tenant_a):
        stream = Stream.objects.get(stream_id=f"race-{round_}")
        assert stream.length == len(winner) and stream.head_hash == winner[-1]["_h"]
        assert list(
            Record.objects.filter(stream=stream).order_by("position").values_list("h", flat=True)
        ) == [r["_h"] for r in winner]


def test_racing_extensions_of_a_held_head(transactional_db: None, tenant_a: Tenant) -> None:
    base = chain(saga_records())
    in_tenant(services.ingest, tenant_a, "ext", base, actor=named_actor("test"))
    forks = [chain(saga_records(), prev=base[-1]["_h"], seq=base[-1]["seq"] + 1) for _ in range(3)]
    outcomes = _race(tenant_a, forks, "ext")
    assert sum(isinstance(o, services.IngestResult) for o in outcomes) == 1
    assert all(o.code == "equivocation" for o in outcomes if isinstance(o, services.IngestRefused))


def test_same_batch_twice_at_once_is_stored_once(transactional_db: None, tenant_a: Tenant) -> None:
    batch = chain(saga_records(steps=3))
    outcomes = _race(tenant_a, [batch, batch], "same")
    assert sorted((o.accepted, o.duplicates) for o in outcomes) == [(0, len(batch)), (len(batch), 0)]


def test_leaf_indices_stay_contiguous_across_concurrent_streams(
    transactional_db: None, tenant_a: Tenant
) -> None:
    streams = 4
    batches = [chain(saga_records(steps=2)) for _ in range(streams)]
    with tenant_context(tenant_a):
        held = TenantLog.objects.get().size  # the server stream's records of the tenant's creation
    results = at_once(
        lambda n: in_tenant(services.ingest, tenant_a, f"par-{n}", batches[n], actor=named_actor("test")),
        range(streams),
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    assert [(r.accepted, r.duplicates) for r in results] == [(len(b), 0) for b in batches]
    total = sum(len(b) for b in batches)
    with tenant_context(tenant_a):
        for n, batch in enumerate(batches):
            stream = Stream.objects.get(stream_id=f"par-{n}")
            assert stream.length == len(batch) and stream.head_hash == batch[-1]["_h"]
            stored = Record.objects.filter(stream=stream).order_by("position").values_list("h", flat=True)
            assert list(stored) == [r["_h"] for r in batch]
        leaves = list(Record.objects.order_by("leaf_index").values_list("leaf_index", flat=True))
        # Every record of every stream has a leaf, and the leaves of the racing streams interleave
        # without a gap or a repeat.
        assert leaves == list(range(held + total))
        assert TenantLog.objects.get().size == held + total
