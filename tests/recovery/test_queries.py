"""Recovery's vendor SQL (recovery/queries.py) answers the same on every database: each test
asserts one answer, and the suite runs it on Postgres and on SQLite."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from core.scoping import tenant_context
from recovery import queries
from recovery.models import Delivery, Job, JobState, Run, RunKind, RunState
from tenants.actors import system_actor
from tenants.models import Tenant

pytestmark = pytest.mark.django_db


def _row(tenant: Tenant, run: Run, **changes: object) -> dict[str, object]:
    now = timezone.now()
    row: dict[str, object] = {
        "id": uuid.uuid4(),
        "tenant_id": tenant.pk,
        "run_id": run.pk,
        "saga_id": run.saga_id,
        "step_id": "s1-a",
        "ordinal": 2,
        "tool": "shop.charge",
        "semantics": "COMPENSABLE",
        "step_status": "committed",
        "handler": "shop.refund",
        "kwargs": {"charge_id": "ch_1", "note": "café ☕", "n": [1, 2.5, None]},
        "idempotency_key": "idem-1",
        "delivery": Delivery.WORKER,
        "state": JobState.PENDING,
        "epoch": 0,
        "claimed_by": "",
        "lease_expires_at": None,
        "attempts": 0,
        "max_attempts": 5,
        "available_at": now,
        "created_at": now - timedelta(microseconds=1),
        "first_claimed_at": None,
        "finished_at": None,
        "last_error": "",
        "escalation": "",
        "escalated_at": None,
        "note": "",
        "resolved_by": "",
        "assignee": "",
        "assigned_at": None,
    }
    row.update(changes)
    return row


def _run(tenant: Tenant) -> Run:
    return Run.objects.create(
        saga_id="s1", kind=RunKind.CRASH, actor=system_actor("recovery"), state=RunState.ACTIVE, frontier=2
    )


def test_insert_jobs_stores_each_column_as_given(tenant_a: Tenant) -> None:
    with tenant_context(tenant_a):
        run = _run(tenant_a)
        rows = [_row(tenant_a, run), _row(tenant_a, run, step_id="s1-b", ordinal=1, handler="x")]
        queries.insert_jobs(rows)
        for row in rows:
            job = Job.objects.get(pk=str(row["id"]))
            stored = {str(f.column): getattr(job, f.attname) for f in Job._meta.concrete_fields}
            assert stored == row


def test_insert_jobs_refuses_rows_that_do_not_name_every_column(tenant_a: Tenant) -> None:
    with tenant_context(tenant_a):
        row = _row(tenant_a, _run(tenant_a))
        del row["note"]
        with pytest.raises(RuntimeError, match="note"):
            queries.insert_jobs([row])
        assert not Job.objects.exists()


def test_the_takeover_turn_is_granted_and_kept_within_a_transaction(tenant_a: Tenant) -> None:
    with tenant_context(tenant_a):
        assert queries.takeover_turn(tenant_a) is True
        assert queries.takeover_turn(tenant_a) is True  # the same transaction asks again
