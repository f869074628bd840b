"""The sealer seals what was accepted, then one integrator pass integrates records and seals under
one signed checkpoint that extends the previous one; a seal pass that leaves a backlog runs again
at once."""

from __future__ import annotations

from typing import Any

import pytest
from sagaplane import merkle, note

from audit.models import TenantLog
from core.scoping import tenant_context
from tenants.models import Tenant
from tests.support.chains import Writer
from tests.support.scoping import in_tenant
from tests.support.transparency import seal_records, seal_watermark, settle
from transparency import keys, proofs, services, sources, tasks
from transparency.actions import seals
from transparency.models import Checkpoint, TreeState


def _checkpoints(tenant: Tenant) -> list[Checkpoint]:
    with tenant_context(tenant):
        return list(Checkpoint.objects.order_by("id"))


def _seal_leaves(tenant: Tenant) -> dict[str, int]:
    return dict(seal_records(tenant))


def _log_size(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return TenantLog.objects.get().size


def _state(tenant: Tenant) -> TreeState:
    with tenant_context(tenant):
        return TreeState.objects.get()


def test_one_checkpoint_covers_a_multi_batch_pass_and_extends_the_previous(
    tenant_a: Tenant, writer_a: Writer
) -> None:
    settle(tenant_a)
    before = _checkpoints(tenant_a)
    assert before  # settle signed what tenant administration logged
    writer_a.saga("one")  # three batches, two sagas finished
    writer_a.saga("two")
    writer_a.saga("open", end=None)

    assert tasks.seal_tenant(tenant_a.pk) == 2  # the sealer: both finished sagas, in one call
    assert tasks._integrate_pass(tenant_a) is False  # one integrator pass, nothing left behind

    new = _checkpoints(tenant_a)[len(before) :]
    assert len(new) == 1  # records and seals alike: one checkpoint, not one per batch or phase
    checkpoint, previous = new[0], before[-1]
    seals = _seal_leaves(tenant_a)
    assert sorted(seals) == ["one", "two"]
    assert checkpoint.size == _log_size(tenant_a) > max(seals.values())  # the seals are signed too
    origin = keys.log_origin(tenant_a)
    with tenant_context(tenant_a):
        signed = note.open_checkpoint(checkpoint.note, services.verifiers(), origin)
        last = note.open_checkpoint(previous.note, services.verifiers(), origin)
        _, proof = proofs.consistency(last.size, signed.size)
    assert signed.size == checkpoint.size and last.size < signed.size
    merkle.verify_consistency(last.size, signed.size, proof, last.root_hash, signed.root_hash)
    # The seal watermark moved over the pass's own seals: nothing is left to look at.
    assert seal_watermark(tenant_a) == _state(tenant_a).size == checkpoint.size
    assert tenant_a.pk not in services.tenants_to_seal() + services.tenants_to_integrate()


def test_a_pass_that_leaves_a_backlog_runs_again_at_once(
    tenant_a: Tenant, writer_a: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settle(tenant_a)
    for n in range(4):
        writer_a.saga(f"s{n}")  # 6 records each
    monkeypatch.setattr(seals, "SEAL_PASS_LEAVES", 6)  # a seal pass looks at one saga's worth
    backlogs: list[bool] = []
    real = services.seal_pass

    def counted(tenant: Tenant, **kwargs: Any) -> tuple[list[str], bool]:
        sealed, sealed_up = real(tenant, **kwargs)
        backlogs.append(not sealed_up)
        return sealed, sealed_up

    monkeypatch.setattr(services, "seal_pass", counted)
    monkeypatch.setattr(tasks, "_requested", lambda tenant_id, kind=tasks.INTEGRATE: False)
    integrations: list[int] = []
    monkeypatch.setattr(tasks, "request_integration", integrations.append)

    assert tasks.seal_tenant(tenant_a.pk) == 4

    # Each pass but the last left accepted leaves unsealed, and the next one ran in the same call
    # (not at the next beat); each that sealed asked for the seals to be signed.
    assert len(backlogs) >= 4 and backlogs[-1] is False and all(backlogs[:-1])
    assert sorted(_seal_leaves(tenant_a)) == ["s0", "s1", "s2", "s3"]
    assert integrations and set(integrations) == {tenant_a.pk}
    assert seal_watermark(tenant_a) == _log_size(tenant_a)
    size = tasks.integrate_tenant(tenant_a.pk)
    assert size == _log_size(tenant_a) == _checkpoints(tenant_a)[-1].size


def test_seals_do_not_bring_their_saga_back_to_the_next_pass(
    tenant_a: Tenant, writer_a: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settle(tenant_a)
    writer_a.saga("done")
    start = seal_watermark(tenant_a)
    real_append = sources.append_server_records

    def append_after_an_ingest(
        tenant: Tenant, entries: list[tuple[str, dict[str, Any]]], *, actor: str
    ) -> int:
        # A batch commits between the pass's read and its seals: they land past the watermark.
        writer_a.saga("other", end=None)
        return real_append(tenant, entries, actor=actor)

    monkeypatch.setattr(sources, "append_server_records", append_after_an_ingest)
    sealed, _ = in_tenant(services.seal_pass, tenant_a)
    monkeypatch.undo()
    assert sealed == ["done"]
    seal_leaf = _seal_leaves(tenant_a)["done"]
    sealed_to = seal_watermark(tenant_a)
    assert start < sealed_to < seal_leaf  # the other batch's leaves are still to look at
    with tenant_context(tenant_a):
        # The seal's own leaf touches "done" no more; only the open saga's records are there.
        assert sources.terminal_sagas_touched(tenant_a, sealed_to, seal_leaf + 1) == {}
    reads: list[list[str]] = []
    real_inputs = sources.seal_inputs

    def spy(tenant: Tenant, sagas: dict[str, sources.Span], start: int, end: int) -> Any:
        reads.append(sorted(sagas))
        return real_inputs(tenant, sagas, start, end)

    monkeypatch.setattr(sources, "seal_inputs", spy)
    assert in_tenant(services.seal_pass, tenant_a) == ([], True)
    assert reads == []  # nothing re-read
    assert len(_seal_leaves(tenant_a)) == 1


def test_reading_by_leaf_range_finds_what_reading_by_saga_id_finds(
    tenant_a: Tenant, writer_a: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settle(tenant_a)
    writer_a.saga("early")
    settle(tenant_a)  # sealed: its latest seal follows its records
    writer_a.saga("open", end=None)
    writer_a.ship(("STEP_COMMITTED", {"saga_id": "early", "step_id": "late", "tool": "t"}))
    writer_a.saga("late\x00id")  # an id whose index copy is not exact
    writer_a.ship(("SAGA_COMPLETE", {"saga_id": "open"}))
    size = _log_size(tenant_a)
    with tenant_context(tenant_a):
        sagas = sources.terminal_sagas_touched(tenant_a, 0, size)
        assert set(sagas) == {"early", "late\ufffdid", "open"}
        by_range = sources.seal_inputs(tenant_a, sagas, 0, size)
        monkeypatch.setattr(sources, "SEAL_RANGE_SLACK", -(size + 1))  # nothing is near: by saga id
        by_id = sources.seal_inputs(tenant_a, sagas, 0, size)
    assert by_range == by_id
    assert [r.record.get("event") for r in by_range["early"]][-2:] == ["SAGA_SEALED", "STEP_COMMITTED"]
    exact = {r.record.get("saga_id") for r in by_range["late\ufffdid"]}
    assert exact == {"late\x00id"}  # payloads read for the inexact id
    # The early saga's seal is followed by a record, so it is stale without reading its payload.
    assert "leaves" not in by_range["early"][-2].record
    fields, current = seals._seal_fields(by_range["early"], "early")
    assert not current and [leaf for leaf, _ in fields["leaves"]][-1] == by_range["early"][-1].leaf_index
