"""Recovery jobs through the real API: the sweep takes an expired saga over, jobs run newest
first, a stale fencing token records nothing, escalations wait for a human, "rollback to here",
and a third tenant sees nothing. Both databases."""

from __future__ import annotations

import time
from typing import Any

import pytest
from rest_framework.test import APIClient

from audit.services import chain_pending_server_records
from core.scoping import tenant_context
from fleet import services as fleet
from recovery import selectors, services
from recovery.actions import results
from recovery.models import Job, JobState, Lease, LeaseState, Run, RunState
from sagas.models import Saga, SagaStatus, Step, StepStatus
from tenants.actors import named_actor, user_actor
from tenants.models import Tenant
from tests.recovery.sagas import HANDLER, crashed, sweep_later
from tests.support.chains import Writer, server_stream
from tests.support.factories import Person
from tests.support.scoping import in_tenant

pytestmark = pytest.mark.django_db

CLAIM = "/api/v1/recovery/claim"


def claim(client: APIClient, **extra: Any) -> dict[str, Any] | None:
    response = client.post(CLAIM, {"handlers": [HANDLER], **extra}, format="json")
    assert response.status_code == 200, response.content
    return response.json()["job"]


def report(client: APIClient, job: dict[str, Any], what: str = "complete", **body: Any) -> Any:
    return client.post(
        f"/api/v1/recovery/jobs/{job['id']}/{what}", {"token": job["token"], **body}, format="json"
    )


def saga_of(tenant: Tenant, saga_id: str) -> Saga:
    with tenant_context(tenant):
        return Saga.objects.get(saga_id=saga_id)


def step_statuses(tenant: Tenant, saga_id: str) -> list[str]:
    """As the saga's page shows them once its results' records are chained (by the sweep)."""
    chain_pending_server_records(tenant, wait=True)
    with tenant_context(tenant):
        return list(
            Step.objects.filter(saga__saga_id=saga_id).order_by("ordinal").values_list("status", flat=True)
        )


def test_an_expired_saga_is_rolled_back_newest_first_and_recorded(alice: Person, writer_a: Writer) -> None:
    tenant = alice.tenant
    crashed(writer_a, "s1", steps=3)
    with tenant_context(tenant):
        lease = Lease.objects.get(saga_id="s1")
        assert lease.state == LeaseState.LIVE and lease.expires_at is not None
    assert sweep_later(tenant)["taken_over"] == 1
    assert saga_of(tenant, "s1").status == SagaStatus.RECOVERING
    assert sweep_later(tenant)["taken_over"] == 0  # taken over once
    worker, other = alice.key_client(), alice.key_client()
    order = []
    for _ in range(3):
        job = claim(worker)
        assert job is not None
        assert claim(other) is None  # the older steps wait until this one is done
        assert job["kwargs"] == {"charge_id": f"ch-s1-{job['step']}"}
        assert job["idempotency_key"] == f"idem-s1-{job['step']}"
        assert report(worker, job).status_code == 200
        order.append(job["step"])
    assert order == [3, 2, 1]
    assert claim(worker) is None
    assert step_statuses(tenant, "s1") == [StepStatus.COMPENSATED] * 3
    assert saga_of(tenant, "s1").status == SagaStatus.ROLLED_BACK
    events = [(r["event"], r.get("step_id")) for r in server_stream(tenant) if r.get("saga_id") == "s1"]
    assert events == [
        ("RECOVERY_STARTED", None),
        ("COMPENSATED", "s1-s3"),
        ("COMPENSATED", "s1-s2"),
        ("COMPENSATED", "s1-s1"),
        ("ROLLBACK_END", None),
    ]
    with tenant_context(tenant):
        assert {k[1]: v["state"] for k, v in selectors.compensations(["s1"]).items()} == {
            "s1-s1": "compensated",
            "s1-s2": "compensated",
            "s1-s3": "compensated",
        }


def test_a_stale_token_records_nothing(alice: Person, writer_a: Writer) -> None:
    tenant = alice.tenant
    crashed(writer_a, "s1", steps=1)
    sweep_later(tenant)
    zombie, live = alice.key_client(), alice.key_client()
    first = claim(zombie, lease_s=1)
    assert first is not None
    deadline = time.monotonic() + 10
    second = None
    while second is None and time.monotonic() < deadline:
        second = claim(live, wait=2)  # its lease runs out within a second
    assert second is not None and second["id"] == first["id"] and second["token"] > first["token"]
    refused = report(zombie, first)
    assert refused.status_code == 409 and refused.json()["error"] == "stale_token"
    assert report(zombie, first, "fail", error="late").status_code == 409
    assert report(zombie, first, "heartbeat").status_code == 409
    assert report(live, second).status_code == 200
    again = report(live, second)  # its answer was lost: sent again with the same token
    assert again.status_code == 200 and again.json()["state"] == "compensated"
    assert report(zombie, first).status_code == 409  # the old token still records nothing
    compensated = [r for r in server_stream(tenant) if r["event"] == "COMPENSATED"]
    assert len(compensated) == 1 and compensated[0]["token"] == second["token"]


def test_an_ended_or_quarantined_saga_is_left_alone(alice: Person, writer_a: Writer) -> None:
    tenant = alice.tenant
    crashed(writer_a, "done", steps=1, end="SAGA_COMPLETE")
    crashed(writer_a, "aside", steps=1)
    in_tenant(
        fleet.quarantine,
        tenant,
        "aside",
        fleet.QuarantineCreate.parse({"reason": "looking into it"}),
        actor=named_actor("test"),
    )
    assert sweep_later(tenant)["taken_over"] == 0
    with tenant_context(tenant):
        assert not Run.objects.exists()
        assert Lease.objects.get(saga_id="done").state == LeaseState.ENDED


def test_a_failing_compensation_is_retried_then_escalated(
    alice: Person, writer_a: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "BACKOFF_BASE_S", 0.0)
    tenant = alice.tenant
    crashed(writer_a, "s1", steps=2)
    sweep_later(tenant)
    worker = alice.key_client()
    for attempt in range(1, services.MAX_ATTEMPTS + 1):
        job = claim(worker)
        assert job is not None and job["step"] == 2 and job["attempt"] == attempt
        assert report(worker, job, "fail", error="card network down").status_code == 200
    assert claim(worker) is None  # step 1 waits behind the escalated step 2
    with tenant_context(tenant):
        escalated = list(selectors.human_queue())
        assert [(j.step_id, j.escalation) for j in escalated] == [("s1-s2", "retries_exhausted")]
        assert Run.objects.get().state == RunState.ESCALATED
    failed = [r for r in server_stream(tenant) if r["event"] == "COMPENSATION_FAILED"]
    assert [r["final"] for r in failed] == [False] * (services.MAX_ATTEMPTS - 1) + [True]
    # A human retries it: fresh attempts, the workers take it again.
    risk = alice.session_client()
    assert risk.post(f"/api/v1/recovery/jobs/{escalated[0].pk}/retry").status_code == 200
    job = claim(worker)
    assert job is not None and job["step"] == 2 and job["attempt"] == 1
    assert report(worker, job).status_code == 200
    job = claim(worker)
    assert job is not None and job["step"] == 1


def test_steps_needing_a_human_hold_the_saga(alice: Person, writer_a: Writer) -> None:
    tenant = alice.tenant
    crashed(writer_a, "irrev", steps=2, semantics="IRREVERSIBLE", last="STEP_UNKNOWN")
    crashed(writer_a, "nohandler", steps=2, handler=None)
    sweep_later(tenant)
    worker = alice.key_client()
    assert claim(worker) is None  # both sagas go to the human queue instead
    with tenant_context(tenant):
        queue = {(j.saga_id, j.step_id): j.escalation for j in selectors.human_queue()}
    # The irreversible step 1 committed with a registered compensation: it is no human's business.
    assert queue == {
        ("irrev", "irrev-s2"): "unknown_outcome",
        ("nohandler", "nohandler-s1"): "no_handler",
        ("nohandler", "nohandler-s2"): "no_handler",
    }
    assert saga_of(tenant, "irrev").status == SagaStatus.RECOVERING
    risk = alice.session_client()
    with tenant_context(tenant):
        unknown = Job.objects.get(step_id="irrev-s2")
        nohandler = Job.objects.get(step_id="nohandler-s2")
    refused = risk.post(f"/api/v1/recovery/jobs/{nohandler.pk}/retry")
    assert refused.status_code == 409 and refused.json()["error"] == "no_handler"
    assert risk.post(f"/api/v1/recovery/jobs/{unknown.pk}/resolve", {}, format="json").status_code == 400
    resolved = risk.post(
        f"/api/v1/recovery/jobs/{unknown.pk}/resolve", {"note": "wire confirmed never sent"}, format="json"
    )
    assert resolved.status_code == 200 and resolved.json()["state"] == "resolved"
    record = [r for r in server_stream(tenant) if r["event"] == "RECOVERY_RESOLVED"][-1]
    assert record["note"] == "wire confirmed never sent" and record["actor"].startswith("user:")
    assert record["old"]["state"] == "escalated" and record["new"]["state"] == "resolved"
    job = claim(worker)  # the irreversible saga's remaining step now runs
    assert job is not None and job["saga_id"] == "irrev" and job["step"] == 1
    # Quarantine from the queue: the rest of that saga is cancelled.
    in_tenant(
        services.quarantine,
        tenant,
        "nohandler",
        services.QuarantineCreate.parse({"reason": "fraud review"}),
        actor=user_actor("alice"),
    )
    with tenant_context(tenant):
        assert set(Job.objects.filter(saga_id="nohandler").values_list("state", flat=True)) == {
            JobState.CANCELLED
        }
    # A viewer may look but not decide.
    assert alice.key_client().get("/api/v1/recovery/jobs?state=escalated").status_code == 200


def test_rollback_to_a_chosen_step(alice: Person, bob: Person, writer_a: Writer) -> None:
    tenant = alice.tenant
    crashed(writer_a, "live", steps=2, lease_ttl=600)
    crashed(writer_a, "finished", steps=3, end="SAGA_COMPLETE")
    risk = alice.session_client()
    refused = risk.post("/api/v1/sagas/live/rollback", {"to_step": 0}, format="json")
    assert refused.status_code == 409 and refused.json()["error"] == "agent_running"
    assert (
        bob.session_client()
        .post("/api/v1/sagas/finished/rollback", {"to_step": 1}, format="json")
        .status_code
        == 403
    )
    started = risk.post("/api/v1/sagas/finished/rollback", {"to_step": 1}, format="json")
    assert started.status_code == 201, started.content
    again = risk.post("/api/v1/sagas/finished/rollback", {"to_step": 1}, format="json")
    assert again.status_code == 409 and again.json()["error"] == "run_unfinished"
    worker = alice.key_client()
    steps = []
    while (job := claim(worker)) is not None:
        steps.append(job["step"])
        assert report(worker, job).status_code == 200
    assert steps == [3, 2]
    assert step_statuses(tenant, "finished") == [
        StepStatus.COMMITTED,
        StepStatus.COMPENSATED,
        StepStatus.COMPENSATED,
    ]
    assert saga_of(tenant, "finished").status == SagaStatus.ROLLED_BACK
    end = [r for r in server_stream(tenant) if r["event"] == "ROLLBACK_END"][-1]
    assert end["to_step"] == 1 and end["compensated"] == 2


def test_a_third_tenant_sees_nothing(alice: Person, carol: Person, writer_a: Writer) -> None:
    crashed(writer_a, "s1", steps=1)
    sweep_later(alice.tenant)
    outsider = carol.key_client()
    assert claim(outsider) is None
    assert outsider.get("/api/v1/recovery/jobs").json() == {"jobs": []}
    with tenant_context(alice.tenant):
        job = Job.objects.get()
    fake = {"id": str(job.pk), "token": 1}
    assert report(outsider, fake).status_code == 404
    assert (
        carol.session_client()
        .post(f"/api/v1/recovery/jobs/{job.pk}/resolve", {"note": "x"}, format="json")
        .status_code
        == 404
    )
    assert (
        carol.session_client().post("/api/v1/sagas/s1/rollback", {"to_step": 0}, format="json").status_code
        == 404
    )
    assert claim(alice.key_client()) is not None  # acme's own worker gets it


def test_hostile_claims_are_refused(alice: Person) -> None:
    client = alice.key_client()
    body: dict[str, Any]
    for body in (
        {},
        {"handlers": []},
        {"handlers": "x"},
        {"handlers": ["a" * 300]},
        {"handlers": ["x"], "lease_s": 0},
        {"handlers": ["x"], "lease_s": 1e9},
        {"handlers": ["x"], "worker": 5},
    ):
        response = client.post(CLAIM, body, format="json")
        assert response.status_code == 400, (body, response.content)
    assert (
        client.post("/api/v1/recovery/jobs/not-a-uuid/complete", {"token": 1}, format="json").status_code
        == 404
    )
    assert client.post(CLAIM, {"handlers": ["x"], "wait": "soon"}, format="json").status_code == 200
