"""The saga projection's vendor SQL (sagas/queries.py) answers the same on every database: each
test asserts one answer, and the suite runs it on Postgres and on SQLite."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core.scoping import tenant_context
from sagas import queries, selectors
from sagas.models import Saga, SagaStatus, Step, StepStatus
from tenants.models import Tenant

pytestmark = pytest.mark.django_db


def _saga(tenant: Tenant, saga_id: str, last: int) -> queries.SagaState:
    saga = queries.SagaState(tenant.pk, saga_id, f"agent-{saga_id}")
    now = timezone.now().replace(microsecond=0)
    saga.name, saga.agent, saga.status = f"{saga_id} name", "bot", SagaStatus.RUNNING
    saga.started_at, saga.last_activity_at = now - timedelta(minutes=5), now
    saga.last_lease_at, saga.lease_ttl, saga.lease_expires_at = now, 30.5, now + timedelta(seconds=30)
    saga.last_event, saga.record_count, saga.first_leaf_index, saga.last_leaf_index = "STEP_OK", 3, 1, last
    return saga


def _step(saga: queries.SagaState, step_id: str, ordinal: int, tool: str) -> queries.StepState:
    step = queries.StepState(saga, step_id, ordinal, ordinal, ordinal + 1)
    step.tool, step.semantics, step.status = tool, "COMPENSABLE", StepStatus.COMMITTED
    step.compensation = {"handler": "shop.refund", "kwargs": {"n": [1, 2.5, None], "note": "café ☕"}}
    return step


def _as_stored(saga: queries.SagaState) -> tuple[object, ...]:
    return (saga.pk, saga.saga_id, saga.stream_id, *(getattr(saga, f) for f in queries.SAGA_FIELDS))


def _steps_as_stored(steps: dict[str, queries.StepState]) -> list[tuple[object, ...]]:
    return [
        (s.pk, s.step_id, s.ordinal, s.first_leaf_index, *(getattr(s, f) for f in queries.STEP_FIELDS))
        for s in steps.values()
    ]


def test_saved_sagas_and_steps_are_loaded_back_as_written(tenant_a: Tenant, tenant_b: Tenant) -> None:
    with tenant_context(tenant_b):
        theirs = _saga(tenant_b, "s1", 9)
        assert queries.save(tenant_b.pk, [theirs], [], [_step(theirs, "x", 1, "mail.send")])
    with tenant_context(tenant_a):
        one, two = _saga(tenant_a, "s1", 4), _saga(tenant_a, "s2", 6)
        steps = [_step(one, "a", 1, "shop.charge"), _step(one, "b", 2, "mail.send"), _step(two, "c", 1, "x")]
        assert queries.save(tenant_a.pk, [one, two], [], steps)
        assert one.pk is not None and two.pk is not None and one.pk != theirs.pk
        sagas, loaded = queries.load(tenant_a.pk, ["s1", "s2", "nope"])
        assert sorted(sagas) == ["s1", "s2"]
        assert [_as_stored(sagas[s]) for s in ("s1", "s2")] == [_as_stored(one), _as_stored(two)]
        assert [s.step_id for s in loaded["s1"].values()] == ["a", "b"]  # in ordinal order
        stored = {s.step_id: s.pk for s in Step.objects.all()}
        for step in steps:
            step.pk = stored[step.step_id]
        assert _steps_as_stored(loaded["s1"]) == _steps_as_stored({"a": steps[0], "b": steps[1]})
        assert loaded["nope"] == {}
        # Steps of some sagas only: the others' are left empty.
        some = queries.load(tenant_a.pk, ["s1", "s2"], steps_of={"s2"})[1]
        assert (some["s1"], _steps_as_stored(some["s2"])) == ({}, _steps_as_stored(loaded["s2"]))
        # Changed sagas and steps, and a new step of an existing saga.
        again, again_steps = queries.load(tenant_a.pk, ["s1"])
        saga = again["s1"]
        saga.status, saga.record_count, saga.last_leaf_index = SagaStatus.COMPLETED, 5, 8
        changed = again_steps["s1"]["b"]
        changed.status, changed.compensation, changed.last_leaf_index = StepStatus.COMPENSATED, None, 8
        added = _step(saga, "d", 3, "shop.ship")
        assert queries.save(tenant_a.pk, [], [saga], [changed, added])
        final, final_steps = queries.load(tenant_a.pk, ["s1"])
        assert _as_stored(final["s1"]) == _as_stored(saga)
        final_s1 = final_steps["s1"].values()
        assert [(s.step_id, s.status, s.compensation, s.last_leaf_index) for s in final_s1] == [
            ("a", StepStatus.COMMITTED, steps[0].compensation, 2),
            ("b", StepStatus.COMPENSATED, None, 8),
            ("d", StepStatus.COMMITTED, added.compensation, 4),
        ]
        # Another tenant's saga of the same id is not this tenant's.
        assert queries.load(tenant_a.pk, ["s1"])[0]["s1"].pk == one.pk
    with tenant_context(tenant_b):
        assert queries.load(tenant_b.pk, ["s1", "s2"])[0]["s1"].last_leaf_index == 9
        assert "s2" not in queries.load(tenant_b.pk, ["s2"])[0]


def test_a_guarded_save_writes_only_over_what_its_fold_read(tenant_a: Tenant) -> None:
    with tenant_context(tenant_a):
        saga = _saga(tenant_a, "s1", 4)
        queries.save(tenant_a.pk, [saga], [], [])
        if not queries.guarded_save():  # folds are made under the lock here: nothing to guard
            with pytest.raises(ValueError):
                queries.save(tenant_a.pk, [], [saga], [], snapshot={"s1": (saga.pk, 4)})
            return
        saga.record_count = 7
        assert not queries.save(tenant_a.pk, [], [saga], [], snapshot={"s1": (saga.pk, 3)})  # stale
        assert Saga.objects.get().record_count == 3
        saga.last_leaf_index = -1  # a leaf marker: the batch's first record, at base
        assert queries.save(tenant_a.pk, [], [saga], [], base=20, snapshot={"s1": (saga.pk, 4)})
        assert (Saga.objects.get().record_count, Saga.objects.get().last_leaf_index) == (7, 20)


@pytest.mark.parametrize("cap", [100, 2])  # the tool's sagas read as a list, or past the cap probed
def test_the_sagas_with_a_step_among_listed_ids_are_the_same_on_every_database(
    tenant_a: Tenant, tenant_b: Tenant, cap: int
) -> None:
    with tenant_context(tenant_b):
        theirs = _saga(tenant_b, "t", 1)
        queries.save(tenant_b.pk, [theirs], [], [_step(theirs, "x", 1, "mail.send")])
    with tenant_context(tenant_a):
        sagas = [_saga(tenant_a, f"s{n}", n) for n in range(6)]
        steps = [_step(s, "a", 1, "mail.send" if n % 2 else "shop.charge") for n, s in enumerate(sagas)]
        steps.append(_step(sagas[1], "b", 2, "mail.send"))  # a saga using the tool twice counts once
        queries.save(tenant_a.pk, sagas, [], steps)
        ids = Step.objects.filter(tool="mail.send").order_by().values_list("saga_id", flat=True).distinct()
        found = queries.with_step_in(Saga.objects.all(), ids, selectors.uses_tool("mail.send"), cap=cap)
        assert sorted(found.values_list("saga_id", flat=True)) == ["s1", "s3", "s5"]
        running = Saga.objects.filter(saga_id__in=["s1", "s2", "s3"])
        found = queries.with_step_in(running, ids, selectors.uses_tool("mail.send"), cap=cap)
        assert sorted(found.values_list("saga_id", flat=True)) == ["s1", "s3"]
