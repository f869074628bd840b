"""Saga and step state from records; the projection rebuilt from records equals the incremental one."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management import call_command
from django.utils import timezone

from audit import services
from core.scoping import tenant_context
from sagas.models import Saga, SagaStatus, Step, StepStatus
from sagas.services import rebuild_tenant
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.chains import chain, saga_records
from tests.support.scoping import in_tenant


def _dump(tenant: Tenant) -> Any:
    with tenant_context(tenant):
        sagas = list(
            Saga.objects.order_by("saga_id").values(
                *[f.name for f in Saga._meta.fields if f.name not in ("id",)]
            )
        )
        steps = list(
            Step.objects.order_by("saga__saga_id", "ordinal").values(
                "saga__saga_id",
                "step_id",
                "ordinal",
                "tool",
                "semantics",
                "status",
                "compensation",
                "first_leaf_index",
                "last_leaf_index",
            )
        )
    return sagas, steps


def test_states_follow_the_records(tenant_a: Tenant) -> None:
    bodies = (
        saga_records("s-done", steps=2)
        + saga_records("s-back", steps=2, outcome="rolled_back")
        + saga_records("s-part", steps=2, outcome="partial")
        + saga_records("s-run", outcome="open")
    )
    in_tenant(services.ingest, tenant_a, "p", chain(bodies), actor=named_actor("test"))
    with tenant_context(tenant_a):
        status = dict(Saga.objects.values_list("saga_id", "status"))
        assert status == {
            "s-done": SagaStatus.COMPLETED,
            "s-back": SagaStatus.ROLLED_BACK,
            "s-part": SagaStatus.ROLLBACK_PARTIAL,
            "s-run": SagaStatus.RUNNING,
        }
        steps = {
            s: sorted(Step.objects.filter(saga__saga_id=s).values_list("status", flat=True)) for s in status
        }
        assert steps["s-done"] == [StepStatus.COMMITTED] * 2
        assert steps["s-back"] == [StepStatus.COMPENSATED] * 2
        assert steps["s-part"] == [StepStatus.COMMITTED, StepStatus.COMPENSATION_FAILED]
        running = Saga.objects.get(saga_id="s-run")
        assert running.lease_ttl == 5.0
        assert running.lease_expires_at == running.last_lease_at + timedelta(seconds=5)
        # the records are in the past, so the lease has lapsed: reported as orphaned
        assert running.effective_status() == SagaStatus.ORPHANED
        assert running.effective_status(running.last_lease_at) == SagaStatus.RUNNING


def test_quarantine_and_lease_records(tenant_a: Tenant) -> None:
    now = timezone.now().timestamp()
    bodies = saga_records("q", outcome="open") + [
        {"event": "SAGA_LEASE", "saga_id": "q", "pid": 1},
        {"event": "SAGA_QUARANTINED", "saga_id": "q"},
        {"event": "SAGA_COMPLETE", "saga_id": "q", "clean": True},
    ]
    records = chain(bodies, ts=now)
    in_tenant(services.ingest, tenant_a, "q", records, actor=named_actor("test"))
    with tenant_context(tenant_a):
        saga = Saga.objects.get(saga_id="q")
        assert saga.status == SagaStatus.QUARANTINED  # sticky: the agent cannot lift its own quarantine
        assert abs(saga.last_lease_at.timestamp() - records[3]["ts"]) < 1e-5  # microsecond precision
        assert saga.record_count == len(records)


def test_rebuild_equals_incremental(tenant_a: Tenant, tenant_b: Tenant) -> None:
    first = chain(saga_records("a1", steps=3) + saga_records("a2", steps=2, outcome="rolled_back")[:4])
    in_tenant(services.ingest, tenant_a, "r1", first[:5], actor=named_actor("test"))
    in_tenant(services.ingest, tenant_a, "r1", first[5:], actor=named_actor("test"))
    tail = chain(
        saga_records("a2", steps=0, outcome="partial")[1:] + saga_records("a3"), prev=first[-1]["_h"], seq=1
    )
    in_tenant(services.ingest, tenant_a, "r1", tail, actor=named_actor("test"))
    in_tenant(
        services.ingest,
        tenant_a,
        "r2",
        chain(saga_records("a4", outcome="partial", steps=2)),
        actor=named_actor("test"),
    )
    in_tenant(services.ingest, tenant_b, "r1", chain(saga_records("b1")), actor=named_actor("test"))
    incremental_a, incremental_b = _dump(tenant_a), _dump(tenant_b)
    assert len(incremental_a[0]) == 4 and incremental_a[1]
    with tenant_context(tenant_a):
        rebuild_tenant(tenant_a, chunk=3)
    assert _dump(tenant_a) == incremental_a
    call_command("rebuild_sagas", "--tenant", "acme")
    assert _dump(tenant_a) == incremental_a
    call_command("rebuild_sagas")
    assert _dump(tenant_a) == incremental_a and _dump(tenant_b) == incremental_b
