"""Integration: the tree follows the log, every checkpoint is signed and consistent, and the
integrator refuses to sign anything it cannot prove consistent."""

from __future__ import annotations

from typing import Any

import pytest
from sagaplane import merkle, note

from core.scoping import tenant_context
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.chains import Writer
from tests.support.scoping import in_tenant
from tests.support.transparency import settle
from transparency import keys, services
from transparency.models import Checkpoint, LogSigningKey, TreeNode, TreeState
from transparency.tasks import integrate_fully


def _size(tenant: Tenant) -> int:
    """Leaves so far (tenant administration writes server records too)."""
    return len(_leaf_hashes(tenant))


def _leaf_hashes(tenant: Tenant) -> list[bytes]:
    from audit.models import Record

    with tenant_context(tenant):
        return [bytes(h) for h in Record.objects.order_by("leaf_index").values_list("leaf_hash", flat=True)]


def test_integrate_signs_the_rfc9162_root_of_every_leaf(tenant_a: Tenant, writer_a: Writer) -> None:
    base = _size(tenant_a)
    writer_a.saga("s1")
    checkpoint = in_tenant(services.integrate, tenant_a)
    assert checkpoint is not None
    leaves = _leaf_hashes(tenant_a)
    assert checkpoint.size == len(leaves) == base + 6
    assert bytes(checkpoint.root) == merkle.root_from_leaf_hashes(leaves)
    vkey = in_tenant(services.ensure_signing_key, tenant_a)
    with tenant_context(tenant_a):
        verifier = services.current_verifier_keys()[0]
    parsed = note.open_checkpoint(checkpoint.note, verifier, keys.log_origin(tenant_a))
    assert (parsed.size, parsed.root_hash) == (base + 6, merkle.root_from_leaf_hashes(leaves))
    assert vkey.name == "sagaplane.local/acme"
    # Nothing grew: no new checkpoint.
    assert in_tenant(services.integrate, tenant_a) is None


def test_growth_is_proven_consistent_and_nodes_are_stored(tenant_a: Tenant, writer_a: Writer) -> None:
    writer_a.saga("s1")
    first = in_tenant(services.integrate, tenant_a)
    writer_a.saga("s2", steps=5)
    second = in_tenant(services.integrate, tenant_a)
    assert first is not None and second is not None and second.size > first.size
    tree = merkle.MemoryTree(_leaf_hashes(tenant_a))
    proof = tree.consistency_proof(first.size, second.size)
    merkle.verify_consistency(first.size, second.size, proof, bytes(first.root), bytes(second.root))
    with tenant_context(tenant_a):
        assert TreeNode.objects.filter(level=0).count() == second.size
        stored = {(n.level, n.index): bytes(n.hash) for n in TreeNode.objects.all()}
    for (level, index), digest in stored.items():
        assert tree.subtree_hash(level, index) == digest


def test_a_backlog_is_worked_off_in_bounded_rounds(tenant_a: Tenant, writer_a: Writer) -> None:
    base = _size(tenant_a)
    writer_a.saga("s1", steps=10)
    assert in_tenant(services.integrate, tenant_a, max_leaves=7) is not None
    with tenant_context(tenant_a):
        assert TreeState.objects.get().size == 7
    final = integrate_fully(tenant_a, max_leaves=7)
    assert final is not None and final.size == base + 22
    with tenant_context(tenant_a):
        sizes = list(Checkpoint.objects.order_by("id").values_list("size", flat=True))
    assert sizes == [*range(7, base + 22, 7), base + 22]


def test_refuses_to_sign_after_the_state_was_tampered(tenant_a: Tenant, writer_a: Writer) -> None:
    writer_a.saga("s1")
    in_tenant(services.integrate, tenant_a)
    with tenant_context(tenant_a):
        state = TreeState.objects.get()
        state.compact_hashes = b"\x01" * len(bytes(state.compact_hashes))
        state.save()
    writer_a.saga("s2")
    with pytest.raises(services.IntegrationRefused, match="disagrees with the stored tree nodes"):
        in_tenant(services.integrate, tenant_a)
    with tenant_context(tenant_a):
        assert Checkpoint.objects.count() == 1


def test_never_signs_a_checkpoint_inconsistent_with_the_last_one(tenant_a: Tenant, writer_a: Writer) -> None:
    """Rewrite history consistently (node rows and compact range agree, as an attacker with the
    database would make them): the new root no longer extends the signed one, so nothing is signed."""
    writer_a.saga("s1")
    signed = in_tenant(services.integrate, tenant_a)
    assert signed is not None
    level, index = merkle.perfect_subtrees(0, signed.size)[0]  # the left edge of the compact range
    forged = b"\x07" * 32
    with tenant_context(tenant_a):
        TreeNode.objects.filter(level=level, index=index).update(hash=forged)
        state = TreeState.objects.get()
        state.compact_hashes = forged + bytes(state.compact_hashes)[32:]
        state.save()
    writer_a.saga("s2")
    with pytest.raises(
        services.IntegrationRefused, match=f"not consistent with the checkpoint of {signed.size}"
    ):
        in_tenant(services.integrate, tenant_a)
    with tenant_context(tenant_a):
        assert list(Checkpoint.objects.values_list("size", flat=True)) == [signed.size]


def test_refuses_when_the_last_note_does_not_verify(tenant_a: Tenant, writer_a: Writer) -> None:
    writer_a.saga("s1")
    signed = in_tenant(services.integrate, tenant_a)
    assert signed is not None
    with tenant_context(tenant_a):
        cp = Checkpoint.objects.get()
        cp.note = cp.note.replace(f"\n{signed.size}\n", f"\n{signed.size - 1}\n")
        cp.save()
    writer_a.saga("s2")
    with pytest.raises(services.IntegrationRefused, match="does not verify"):
        in_tenant(services.integrate, tenant_a)


def test_seed_is_encrypted_at_rest(tenant_a: Tenant, writer_a: Writer) -> None:
    import base64

    from django.db import connection

    in_tenant(services.ensure_signing_key, tenant_a)
    with tenant_context(tenant_a):
        row = LogSigningKey.objects.get()
        seed = keys.decrypt_seed(row.encrypted_seed)
        with connection.cursor() as cursor:
            cursor.execute("SELECT encrypted_seed FROM transparency_logsigningkey WHERE id = %s", [row.pk])
            stored = cursor.fetchone()[0]
    assert len(seed) == 32
    for spelling in (seed.hex(), base64.b64encode(seed).decode(), base64.b64encode(b"\x01" + seed).decode()):
        assert spelling not in stored
    assert seed not in stored.encode()
    signer = note.Signer.from_seed(row.name, seed)
    assert signer.public_key == bytes(row.public_key)


def test_key_rotation_cosigns_then_retires(tenant_a: Tenant, writer_a: Writer) -> None:
    writer_a.saga("s1")
    signed = in_tenant(services.integrate, tenant_a)
    assert signed is not None
    with tenant_context(tenant_a):
        old_key = services.current_verifier_keys()[0]
    in_tenant(services.rotate_signing_key, tenant_a, actor=named_actor("test"))
    with tenant_context(tenant_a):
        new_key, also_old = services.current_verifier_keys()
        rotated = Checkpoint.objects.order_by("-id").first()
    assert also_old == old_key and new_key != old_key
    assert rotated is not None and rotated.size == signed.size
    note.open_checkpoint(rotated.note, old_key)
    note.open_checkpoint(rotated.note, new_key)
    in_tenant(services.finish_key_rotation, tenant_a, actor=named_actor("test"))
    writer_a.saga("s2")
    latest = in_tenant(services.integrate, tenant_a)
    assert latest is not None
    note.open_checkpoint(latest.note, new_key)
    with pytest.raises(note.SignatureError):
        note.open_checkpoint(latest.note, old_key)


def test_integrator_task_seals_finished_sagas_and_signs_the_seal(tenant_a: Tenant, writer_a: Writer) -> None:
    from audit.models import Record

    base = _size(tenant_a)
    writer_a.saga("done")
    writer_a.saga("open", end=None)
    assert tenant_a.pk in services.tenants_to_integrate()
    settle(tenant_a)
    with tenant_context(tenant_a):
        seals = list(Record.objects.filter(event=services.SEAL_EVENT).values_list("saga_id", "leaf_index"))
        state = TreeState.objects.get()
    assert [s for s, _ in seals] == ["done"]
    assert state.size == base + 12  # 6 + 5 + the seal, all signed
    assert tenant_a.pk not in services.tenants_to_integrate()


def test_the_ingest_hook_integrates_after_commit(
    tenant_a: Tenant, writer_a: Writer, django_capture_on_commit_callbacks: Any
) -> None:
    from controlplane.celery import app

    previous, app.conf.task_always_eager = app.conf.task_always_eager, True
    try:
        # The ingest itself schedules the integration (audit.actions.storage calls the hook).
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            writer_a.saga("s1")
        with tenant_context(tenant_a):
            assert not Checkpoint.objects.exists()  # nothing happens inside the ingest transaction
        for callback in callbacks:
            callback()
    finally:
        app.conf.task_always_eager = previous
    with tenant_context(tenant_a):
        assert Checkpoint.objects.order_by("-id").first().size == _size(tenant_a)  # type: ignore[union-attr]


def test_the_beat_task_integrates_every_grown_tenant(
    tenant_a: Tenant, tenant_b: Tenant, writer_a: Writer, writer_b: Writer
) -> None:
    from transparency.tasks import integrate_grown_tenants

    writer_a.saga("a1")
    writer_b.saga("b1")
    assert set(integrate_grown_tenants()) >= {tenant_a.pk, tenant_b.pk}
    assert services.tenants_to_integrate() == []
    for tenant in (tenant_a, tenant_b):
        with tenant_context(tenant):
            assert TreeState.objects.get().size == _size(tenant)


def _tree_size(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return TreeState.objects.get().size


def test_one_integrator_per_tenant_a_batch_committed_during_its_pass_is_integrated_by_it(
    tenant_a: Tenant,
    writer_a: Writer,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from controlplane.celery import app
    from transparency import tasks

    settle(tenant_a)
    writer_a.saga("first")
    passes: list[int] = []
    inner_returned: list[int] = []
    real_pass = tasks._integrate_pass

    def pass_while_a_batch_arrives(tenant: Tenant) -> bool:
        backlog = real_pass(tenant)
        passes.append(_tree_size(tenant))
        if len(passes) == 1:
            # A batch commits mid-run: its after-commit hook requests an integration, and the task
            # (run at once here) finds this integrator's claim and returns, integrating nothing.
            with django_capture_on_commit_callbacks(execute=True):
                writer_a.saga("second")
            inner_returned.append(_tree_size(tenant))
        return backlog

    monkeypatch.setattr(tasks, "_integrate_pass", pass_while_a_batch_arrives)
    monkeypatch.setitem(app.conf, "task_always_eager", True)
    size = tasks.integrate_tenant(tenant_a.pk)

    assert inner_returned == [passes[0]]  # the second call left the work to the running one
    assert len(passes) == 2  # which found the request and ran again
    assert size == _tree_size(tenant_a) == _size(tenant_a)  # "second" and its seal are signed
    with tenant_context(tenant_a):
        assert Checkpoint.objects.order_by("-id").first().size == size  # type: ignore[union-attr]
    assert not tasks._requested(tenant_a.pk)


def test_a_call_finding_the_tenant_claimed_returns_and_leaves_its_request(
    tenant_a: Tenant, writer_a: Writer
) -> None:
    from django.core.cache import cache

    from transparency import tasks

    settle(tenant_a)
    before = _tree_size(tenant_a)
    writer_a.saga("waiting")
    assert tasks._claim(tenant_a, "someone-else")
    try:
        cache.set(tasks._request_key(tenant_a.pk), "1")
        assert tasks.integrate_tenant(tenant_a.pk) == before  # nothing integrated, nothing blocked
        assert tasks._requested(tenant_a.pk)  # the running integrator's to take
    finally:
        tasks._release(tenant_a, "someone-else")
    assert tasks.integrate_tenant(tenant_a.pk) == _size(tenant_a)
    assert not tasks._requested(tenant_a.pk)


def test_integrate_fully_stops_at_the_log_size_without_an_empty_round(
    tenant_a: Tenant, writer_a: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    rounds: list[tuple[bool, bool]] = []
    real = services.integrate_round

    def counted(tenant: Tenant, max_leaves: int | None) -> Any:
        checkpoint, caught_up = real(tenant, max_leaves)
        rounds.append((checkpoint is not None, caught_up))
        return checkpoint, caught_up

    monkeypatch.setattr(services, "integrate_round", counted)
    writer_a.saga("s1", steps=10)
    final = integrate_fully(tenant_a, max_leaves=7)
    assert final is not None and final.size == _size(tenant_a)
    # Rounds of 7 until the last reaches the log's size; no round after it to find nothing.
    assert rounds[-1] == (True, True) and all(made and not done for made, done in rounds[:-1])
    rounds.clear()
    assert integrate_fully(tenant_a) is None  # nothing new: one round, which says so
    assert rounds == [(False, True)]


def test_a_seal_batch_reads_no_steps(
    tenant_a: Tenant, writer_a: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sagas import queries

    writer_a.saga("done", steps=3)
    asked: list[list[int]] = []
    real = queries._select_steps

    def recorded(tenant_id: int, saga_pks: list[int]) -> Any:
        asked.append(list(saga_pks))
        return real(tenant_id, saga_pks)

    monkeypatch.setattr(queries, "_select_steps", recorded)
    settle(tenant_a)  # integrates and appends the saga's seal (a record about the saga, no step)
    assert asked and all(pks == [] for pks in asked)
    asked.clear()
    writer_a.ship(
        ("STEP_COMPENSATED_NOTE", {"saga_id": "done"}),
        ("COMPENSATED", {"saga_id": "done", "step_id": "done-s0"}),
    )
    assert len(asked) == 1 and len(asked[0]) == 1  # a step record of a held saga: its steps are read
    with tenant_context(tenant_a):
        from sagas.models import Saga

        saga = Saga.objects.get(saga_id="done")
        assert saga.status == "completed" and saga.steps.get(step_id="done-s0").status == "compensated"
