"""A result's evidence (COMPENSATED / COMPENSATION_FAILED, ROLLBACK_END) is accepted with the job's
row, as pending rows, and chained into the server stream in batches (group commit by time): once a
result's transaction commits, a pending row older than the window makes it chain everything
pending in one append; the sweep chains what a burst leaves. Results that arrive together are each
chained exactly once, in an intact chain, and evidence whose chaining failed stays pending until a
later pass chains it, once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from sagaplane.chain import verify_chain

from audit import services as audit_services
from audit.actions import server_stream as server_stream_actions
from core.scoping import tenant_context
from recovery import services
from recovery.models import Job, JobState
from sagas.models import Saga, SagaStatus
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.recovery.sagas import HANDLER, crashed, sweep_later
from tests.support.chains import Writer, server_stream
from tests.support.concurrency import at_once
from tests.support.scoping import in_tenant


def evidence(tenant: Tenant, event: str, *, flush: bool = True) -> Counter[str]:
    """How many `event` records the server stream holds per step (per saga for ROLLBACK_END)."""
    records = server_stream(tenant, flush=flush)
    assert verify_chain(records).intact
    key = "saga_id" if event == "ROLLBACK_END" else "step_id"
    return Counter(str(r[key]) for r in records if r["event"] == event)


def claimed(tenant: Tenant, n: int) -> list[Job]:
    jobs = in_tenant(services.claim_many, tenant, worker="w", handlers=[HANDLER], max_jobs=n)
    assert len(jobs) == n
    return jobs


@pytest.mark.postgres
def test_concurrent_single_results_each_land_once_with_their_evidence(
    transactional_db: None, tenant_a: Tenant
) -> None:
    sagas = 8
    writer = Writer(tenant_a, "agent-a-1")
    for n in range(sagas):
        crashed(writer, f"c{n}", steps=1)
    assert sweep_later(tenant_a)["taken_over"] == sagas
    jobs = claimed(tenant_a, sagas)
    outcomes = at_once(
        lambda job: in_tenant(
            services.complete,
            tenant_a,
            job.pk,
            services.Completion(token=job.epoch),
            actor=named_actor("test"),
        ),
        jobs,
    )
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    with tenant_context(tenant_a):
        assert Job.objects.filter(state=JobState.COMPENSATED).count() == sagas
    # Re-checks are bounded: what a burst leaves pending is the sweep's (it chains all of it).
    sweep_later(tenant_a)
    assert in_tenant(audit_services.pending_server_records, tenant_a) == 0
    assert evidence(tenant_a, "COMPENSATED") == {f"c{n}-s1": 1 for n in range(sagas)}
    assert evidence(tenant_a, "ROLLBACK_END") == {f"c{n}": 1 for n in range(sagas)}
    with tenant_context(tenant_a):
        assert set(Saga.objects.values_list("status", flat=True)) == {SagaStatus.ROLLED_BACK}
    # Another pass finds nothing left to chain.
    sweep_later(tenant_a)
    assert evidence(tenant_a, "COMPENSATED") == {f"c{n}-s1": 1 for n in range(sagas)}


@pytest.mark.django_db
def test_evidence_whose_append_failed_after_the_result_stays_pending_and_is_chained_once(
    tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = Writer(tenant_a, "agent-a-1")
    crashed(writer, "s1", steps=2)
    sweep_later(tenant_a)
    (newest,) = claimed(tenant_a, 1)

    def crash(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("the appender died")

    with monkeypatch.context() as patched:
        patched.setattr(server_stream_actions, "_chain_onto", crash)
        job = in_tenant(
            services.complete,
            tenant_a,
            newest.pk,
            services.Completion(token=newest.epoch),
            actor=named_actor("test"),
        )
        assert job.state == JobState.COMPENSATED
        # The result is recorded and the saga moves on: its next (older) step is claimable.
        (older,) = claimed(tenant_a, 1)
        assert older.step_id == "s1-s1"
        failed = in_tenant(
            services.fail,
            tenant_a,
            older.pk,
            services.Failure(token=older.epoch, error="card declined"),
            actor=named_actor("test"),
        )
        assert failed.state == JobState.PENDING
    assert in_tenant(audit_services.pending_server_records, tenant_a) == 2
    with monkeypatch.context() as patched:  # a pass that fails to chain leaves them pending
        patched.setattr(server_stream_actions, "_chain_onto", crash)
        with pytest.raises(RuntimeError):
            audit_services.chain_pending_server_records(tenant_a, wait=True)
    assert in_tenant(audit_services.pending_server_records, tenant_a) == 2
    assert evidence(tenant_a, "COMPENSATED", flush=False) == {}
    assert sweep_later(tenant_a)["taken_over"] == 0  # the later pass: the sweep
    assert in_tenant(audit_services.pending_server_records, tenant_a) == 0
    assert evidence(tenant_a, "COMPENSATED") == {"s1-s2": 1}
    assert evidence(tenant_a, "COMPENSATION_FAILED") == {"s1-s1": 1}
    records = [r for r in server_stream(tenant_a) if r.get("saga_id") == "s1"]
    assert [r["event"] for r in records] == ["RECOVERY_STARTED", "COMPENSATED", "COMPENSATION_FAILED"]
    assert records[1]["token"] == newest.epoch
    sweep_later(tenant_a)
    assert evidence(tenant_a, "COMPENSATED") == {"s1-s2": 1}


@pytest.mark.django_db
def test_a_direct_server_append_chains_pending_evidence_first(
    tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = Writer(tenant_a, "agent-a-1")
    crashed(writer, "s1", steps=1)
    sweep_later(tenant_a)
    (job,) = claimed(tenant_a, 1)
    with monkeypatch.context() as patched:
        patched.setattr(server_stream_actions, "_chain_onto", lambda *_a, **_k: 1 / 0)
        in_tenant(
            services.complete,
            tenant_a,
            job.pk,
            services.Completion(token=job.epoch),
            actor=named_actor("test"),
        )
    assert in_tenant(audit_services.pending_server_records, tenant_a) == 2  # COMPENSATED, ROLLBACK_END
    record = in_tenant(
        audit_services.append_server_record, tenant_a, "NOTE", {"text": "later"}, actor=named_actor("test")
    )
    assert record.event == "NOTE"
    assert in_tenant(audit_services.pending_server_records, tenant_a) == 0
    events = [r["event"] for r in server_stream(tenant_a)]
    assert events[-3:] == ["COMPENSATED", "ROLLBACK_END", "NOTE"]


@pytest.mark.postgres
def test_results_are_chained_together_once_the_oldest_pending_one_is_older_than_the_window(
    transactional_db: None, tenant_a: Tenant, settings: Any
) -> None:
    writer = Writer(tenant_a, "agent-a-1")
    for n in range(3):
        crashed(writer, f"w{n}", steps=1)
    sweep_later(tenant_a)
    first, second, third = claimed(tenant_a, 3)
    settings.EVIDENCE_GROUP_WINDOW_S = 3600.0
    for job in (first, second):  # each commits; none pending is older than the window
        in_tenant(
            services.complete,
            tenant_a,
            job.pk,
            services.Completion(token=job.epoch),
            actor=named_actor("test"),
        )
    assert in_tenant(audit_services.pending_server_records, tenant_a) == 4  # COMPENSATED + ROLLBACK_END each
    assert evidence(tenant_a, "COMPENSATED", flush=False) == {}
    settings.EVIDENCE_GROUP_WINDOW_S = 0.0
    in_tenant(
        services.complete,
        tenant_a,
        third.pk,
        services.Completion(token=third.epoch),
        actor=named_actor("test"),
    )
    # After its commit the third result found pending rows past the window: all six went, in one
    # append (consecutive positions in the server stream), oldest first.
    assert in_tenant(audit_services.pending_server_records, tenant_a) == 0
    records = server_stream(tenant_a, flush=False)
    assert verify_chain(records).intact
    chained = [r for r in records if r["event"] in ("COMPENSATED", "ROLLBACK_END")]
    assert [(r["event"], r["saga_id"]) for r in chained] == [
        ("COMPENSATED", first.saga_id),
        ("ROLLBACK_END", first.saga_id),
        ("COMPENSATED", second.saga_id),
        ("ROLLBACK_END", second.saga_id),
        ("COMPENSATED", third.saga_id),
        ("ROLLBACK_END", third.saga_id),
    ]
    assert [r["seq"] for r in chained] == list(range(chained[0]["seq"], chained[0]["seq"] + 6))
    assert len({r["ts"] for r in chained[:4]}) == 2  # each kept the time it was accepted
