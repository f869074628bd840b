"""/metrics: who may scrape it, and that it answers what on-call asks first (batches accepted and
refused by reason, batch latency, gate decisions, integration lag, queue depths), read through
the real middleware and views. Counters are compared before and after (other tests in this
process count too)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from approvals.models import ApprovalRequest
from approvals.models import Status as ApprovalStatus
from audit.models import TenantLog
from core import metrics
from core.scoping import tenant_context
from fleet import services as fleet_services
from fleet.stores import DatabaseStore
from reconciliation import services as reconciliation_services
from reconciliation.models import CheckStatus, ReconciliationCheck
from recovery.models import Job, JobState, Run, RunKind, RunState
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.chains import chain, saga_records
from tests.support.factories import Person
from tests.support.metrics import scrape, value
from tests.support.scoping import in_tenant
from transparency.tasks import integrate_fully

TOKEN = "metrics-token-" + "x" * 20


def post(person: Person, stream: str, records: Any) -> Any:
    return person.key_client().post(f"/api/v1/streams/{stream}/records", {"records": records}, format="json")


@pytest.fixture
def database_gate_store() -> Iterator[None]:
    fleet_services.set_store(DatabaseStore())
    yield
    fleet_services.set_store(None)


def test_metrics_need_the_token_when_one_is_set(settings: Any, db: None) -> None:
    settings.SAGAPLANE_METRICS_TOKEN = TOKEN
    assert Client().get("/metrics").status_code == 404
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong-" + TOKEN).status_code == 404
    assert Client().get("/metrics", HTTP_AUTHORIZATION=TOKEN).status_code == 404  # no scheme
    assert "sagaplane_ingest_batch_seconds" in scrape(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")


def test_without_a_token_metrics_are_not_served_in_production(settings: Any, db: None) -> None:
    settings.SAGAPLANE_METRICS_TOKEN = ""
    settings.PRODUCTION = True
    assert Client().get("/metrics").status_code == 404
    settings.PRODUCTION = False
    assert Client().get("/metrics").status_code == 200
    assert Client().post("/metrics").status_code == 405


def test_batches_are_counted_by_outcome_and_reason_and_timed(alice: Person) -> None:
    before = scrape()
    records = chain(saga_records(steps=2))
    assert post(alice, "m-1", records[:4]).status_code == 200
    assert post(alice, "m-1", records).status_code == 200  # 4 duplicates, the rest new
    forged = [dict(records[0], seq=7)]  # a digest that no longer matches
    refused = post(alice, "m-2", forged)
    assert refused.status_code == 422, refused.content
    reason = refused.json()["reason"]
    malformed = alice.key_client().post("/api/v1/streams/m-3/records", {"records": "no"}, format="json")
    assert malformed.status_code == 400
    after = scrape()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("sagaplane_ingest_records_total", outcome="accepted") == len(records)
    assert delta("sagaplane_ingest_records_total", outcome="duplicate") == 4
    assert delta("sagaplane_ingest_batches_total", outcome="accepted", reason="") == 2
    assert delta("sagaplane_ingest_batches_total", outcome="refused", reason=reason) == 1
    assert delta("sagaplane_ingest_batches_total", outcome="refused", reason="invalid") == 1
    assert delta("sagaplane_ingest_batch_seconds_count") == 4
    assert delta("sagaplane_ingest_batch_seconds_sum") > 0


def test_gate_decisions_are_counted_by_outcome(alice: Person, database_gate_store: None) -> None:
    owner = alice.session_client()
    budget = {"name": "tiny", "tool": "stripe.*", "max_total": "100", "window_s": 3600}
    assert owner.post("/api/v1/fleet/budgets", budget, format="json").status_code == 201
    agent = alice.key_client()
    before = scrape()
    for n in range(3):
        call = {"saga_id": f"m-saga-{n}", "step_id": "1", "tool": "stripe.charge", "args": {"amount": 60}}
        assert agent.post("/api/v1/gate/evaluate", call, format="json").status_code == 200
    after = scrape()
    allowed = value(after, "sagaplane_gate_decisions_total", decision="allow", reason="")
    denied = value(after, "sagaplane_gate_decisions_total", decision="deny", reason="budget_exceeded")
    assert allowed - value(before, "sagaplane_gate_decisions_total", decision="allow", reason="") == 1
    assert (
        denied - value(before, "sagaplane_gate_decisions_total", decision="deny", reason="budget_exceeded")
        == 2
    )


def test_integration_lag_counts_leaves_waiting_for_a_checkpoint(alice: Person) -> None:
    records = chain(saga_records(steps=2))
    assert post(alice, "lag", records).status_code == 200
    waiting = scrape()
    assert value(waiting, "sagaplane_integration_lag_leaves") >= len(records)
    assert value(waiting, "sagaplane_integration_lagging_tenants") >= 1
    # The oldest waiting leaf was accepted before this scrape: its age is present and positive.
    assert value(waiting, "sagaplane_integration_lag_seconds") > 0
    assert value(waiting, "sagaplane_scrape_errors", source="integration_lag") == 0
    integrate_fully(alice.tenant)
    caught_up = scrape()
    # This tenant's leaves are under a checkpoint now; only other tenants' (none here) remain.
    assert value(caught_up, "sagaplane_integration_lag_leaves") == 0
    assert value(caught_up, "sagaplane_integration_lagging_tenants") == 0


def test_celery_queue_depth_is_read_from_the_broker(db: None) -> None:
    """Messages waiting in the default queue, as the broker counts them: three sent to a queue of
    this test's own (nothing consumes it), then purged (one fixed name: nothing piles up)."""
    from controlplane.celery import app

    queue = "sagaplane-metrics-test"
    default = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    try:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(queue)  # a run interrupted before its own purge
        assert value(scrape(), "sagaplane_celery_queue_depth", queue=queue) == 0
        for _ in range(3):
            app.send_task("sagaplane.tests.never_runs", queue=queue)
        text = scrape()
    finally:
        app.conf.task_default_queue = default
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(queue)
    assert value(text, "sagaplane_scrape_errors", source="celery_queue_depth") == 0
    assert value(text, "sagaplane_celery_queue_depth", queue=queue) == 3


def test_apps_register_their_queues_and_a_failing_one_is_named(db: None) -> None:
    metrics.register_queue("test-approvals", lambda: 3)
    metrics.register_queue("test-broken", lambda: 1 // 0)
    try:
        text = scrape()
    finally:
        metrics._queues.pop("test-approvals")
        metrics._queues.pop("test-broken")
    assert value(text, "sagaplane_queue_depth", queue="test-approvals") == 3
    assert value(text, "sagaplane_scrape_errors", source="queue:test-broken") == 1


def queue_depths(text: str) -> dict[str, float]:
    return {
        sample.labels["queue"]: float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "sagaplane_queue_depth"
    }


def _approval_requests(tenant: Tenant, statuses: list[str]) -> None:
    with tenant_context(tenant):
        for n, status in enumerate(statuses):
            ApprovalRequest.objects.create(
                id=f"q-{tenant.pk}-{n}",
                saga_id=f"saga-{n}",
                step_id="1",
                tool="bank.wire",
                args_digest="0" * 64,
                action_digest="0" * 64,
                status=status,
                expires_at=timezone.now() + timedelta(hours=1),
            )


def _recovery_jobs(tenant: Tenant, states: list[str]) -> None:
    with tenant_context(tenant):
        for n, state in enumerate(states):
            run = Run.objects.create(
                saga_id=f"saga-{n}", kind=RunKind.CRASH, state=RunState.DONE, actor=named_actor("test")
            )
            Job.objects.create(
                run=run,
                saga_id=run.saga_id,
                step_id="1",
                ordinal=1,
                step_status="committed",
                idempotency_key=f"key-{n}",
                state=state,
            )


def _checks(tenant: Tenant, statuses: list[str]) -> None:
    with tenant_context(tenant):
        for n, status in enumerate(statuses):
            ReconciliationCheck.objects.create(
                saga_id=f"saga-{n}",
                step_id="1",
                compensated_leaf=n,
                compensated_in="stream",
                status=status,
                deadline=timezone.now() + timedelta(hours=1),
            )


def test_approval_recovery_and_reconciliation_queues_are_counted_across_tenants(
    tenant_a: Tenant, tenant_b: Tenant, alice: Person
) -> None:
    """Each app's queues, counted over every tenant (the runtime role sees one tenant's rows at a
    time: these counts cross tenants through the apps' count-only functions) and labelled by
    queue only, never by tenant."""

    def log_size(tenant: Tenant) -> int:
        with tenant_context(tenant):
            return TenantLog.objects.values_list("size", flat=True).first() or 0

    # Creating the tenants and their members wrote server records: leaves the pass has not seen.
    before = log_size(tenant_a) + log_size(tenant_b)
    assert queue_depths(scrape()) == {
        "approvals_pending": 0,
        "recovery_pending": 0,
        "recovery_claimed": 0,
        "recovery_escalated": 0,
        "reconciliation_checks_open": 0,
        "reconciliation_leaves_unscanned": before,
    }
    P, A, D = ApprovalStatus.PENDING, ApprovalStatus.APPROVED, ApprovalStatus.DENIED
    _approval_requests(tenant_a, [P, P, A])
    _approval_requests(tenant_b, [P, D, ApprovalStatus.EXPIRED])
    _recovery_jobs(tenant_a, [JobState.PENDING, JobState.CLAIMED, JobState.ESCALATED, JobState.COMPENSATED])
    _recovery_jobs(tenant_b, [JobState.PENDING, JobState.PENDING, JobState.ESCALATED, JobState.RESOLVED])
    _checks(tenant_a, [CheckStatus.PENDING, CheckStatus.CONFIRMED])
    _checks(tenant_b, [CheckStatus.CLAIMED, CheckStatus.PENDING, CheckStatus.DRIFT])
    records = chain(saga_records(steps=2))
    assert post(alice, "queues", records).status_code == 200
    text = scrape()
    assert queue_depths(text) == {
        "approvals_pending": 3,
        "recovery_pending": 3,
        "recovery_claimed": 1,
        "recovery_escalated": 2,
        "reconciliation_checks_open": 3,
        "reconciliation_leaves_unscanned": before + len(records),
    }
    for source in ("approvals", "recovery", "reconciliation"):
        assert value(text, "sagaplane_scrape_errors", source=f"queue:{source}") == 0
    labels = _all_labels(text)
    assert not [names for names in labels if "tenant" in names]
    assert not {tenant_a.slug, tenant_b.slug} & {v for names in labels for v in names.values()}

    in_tenant(reconciliation_services.scan, tenant_a)  # the pass looks at all of tenant a's leaves
    with tenant_context(tenant_a):
        ApprovalRequest.objects.filter(status=P).update(status=A)
    after = queue_depths(scrape())
    assert after["reconciliation_leaves_unscanned"] == log_size(tenant_b)
    assert after["approvals_pending"] == 1


def _all_labels(text: str) -> list[dict[str, str]]:
    return [
        sample.labels
        for family in text_string_to_metric_families(text)
        if family.name.startswith("sagaplane_")
        for sample in family.samples
    ]


def test_every_answer_carries_a_request_id(db: None) -> None:
    given = Client().get("/healthz", HTTP_X_REQUEST_ID="nginx-0123456789abcdef")
    assert given["X-Request-ID"] == "nginx-0123456789abcdef"
    hostile = Client().get("/healthz", HTTP_X_REQUEST_ID="a b\nc")
    assert hostile["X-Request-ID"] != "a b\nc" and len(hostile["X-Request-ID"]) == 32
    assert Client().get("/healthz")["X-Request-ID"] != Client().get("/healthz")["X-Request-ID"]
