"""Celery: the lease sweep (run every second by the beat process's own thread, recovery/sweeper.py)
and webhook deliveries. Celery only wakes the
work: the job row's lease and fencing token decide who may record a result, so a lost, repeated
or late message never runs a compensation twice in the books (the receiver gets the same
`Idempotency-Key` on every attempt)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import shared_task
from django.utils import timezone

from audit.services import chain_pending_server_records
from core.scoping import tenant_context
from recovery import services, sweeper, webhook
from recovery.cross_tenant import tenants_with_recovery_due, tenants_with_unclaimed_jobs
from recovery.models import Delivery, Job, Webhook
from tenants.actors import system_actor
from tenants.entry import tenant_by_id, tenant_task
from tenants.models import Tenant

log = logging.getLogger(__name__)

WEBHOOK_LEASE_S = 30.0  # longer than the request may take


@shared_task(name="recovery.sweep", ignore_result=True)
def sweep_all() -> int:
    """Every tenant with recovery work due: take over expired sagas, escalate, wake webhooks; then
    record the pass (its age is the sweep's lag). Run every second by the beat process's own
    thread (recovery/sweeper.py), never by a message a busy queue could starve; still a task, so
    an operator can run one pass by hand."""
    began = time.monotonic()
    now = timezone.now()
    done = failures = 0
    due = set(tenants_with_recovery_due(now))
    due |= set(tenants_with_unclaimed_jobs(now - services.unclaimed_after()))
    for tenant_id in sorted(due):
        tenant = tenant_by_id(tenant_id)
        if tenant is None:
            continue
        try:
            sweep_tenant(tenant, now=now)
            done += 1
        except Exception:
            failures += 1
            log.exception("recovery sweep of tenant %s failed; the next pass retries", tenant_id)
    sweeper.record_pass(started=began, tenants=len(due), failures=failures)
    return done


def sweep_tenant(
    tenant: Tenant, *, now: datetime | None = None, limit: int = services.SWEEP_BATCH
) -> dict[str, int]:
    """One pass for one tenant, each unit of work a transaction of its own as the tenant: take over
    sagas whose lease expired with no terminal record (quarantined ones are skipped),
    TAKEOVER_BATCH at a time, so workers start on the first batch while the next is taken;
    escalate jobs whose workers kept dying; wake the webhook deliveries that are due; then chain
    the results' evidence left pending. `now` (tests) fixes the clock for the whole pass."""
    taken = 0
    while taken < limit:
        with tenant_context(tenant):
            batch = services.take_over_batch(
                tenant, now=now, limit=min(services.TAKEOVER_BATCH, limit - taken)
            )
        if not batch:
            break
        taken += batch
    now = now or timezone.now()
    with tenant_context(tenant):
        escalated, due_hooks = services.escalate_due(tenant, now=now, limit=limit)
    for job_id in due_hooks:
        services.enqueue_delivery(tenant.pk, job_id)
    # Last (takeovers first): results' evidence left pending (its appender died after its commit,
    # or no result came after it), not what is in flight.
    chain_pending_server_records(tenant, wait=True, before=now.timestamp() - services.EVIDENCE_STALE_S)
    return {"taken_over": taken, "escalated": escalated, "webhooks_woken": len(due_hooks)}


def wake_deliveries(tenant: Tenant, run_id: int) -> None:
    """After a run's transaction committed (recovery.actions.webhooks.wake_webhooks): send its
    webhook deliveries that are due to Celery, read in a transaction of their own as the tenant."""
    with tenant_context(tenant):
        due = services.due_deliveries(tenant, run_id)
    for job_id in due:
        services.enqueue_delivery(tenant.pk, job_id)


def delivery_body(job: object) -> bytes:
    from recovery.selectors import job_for_worker

    return json.dumps(job_for_worker(job), sort_keys=True, separators=(",", ":")).encode()


@shared_task(name="recovery.deliver_webhook", ignore_result=True, acks_late=True, reject_on_worker_lost=True)
@tenant_task(transaction=False)  # the POST waits outside any transaction
def deliver_webhook(tenant: Tenant, job_id: str) -> str:
    """Claim the job (as any worker would), POST it signed, and record the answer with the token
    the claim returned. Nothing to do when the claim fails: someone holds it, or it is not due."""
    with tenant_context(tenant):  # the claim commits before the POST
        job = services.claim(
            tenant,
            worker="webhook",
            handlers=None,
            lease_s=WEBHOOK_LEASE_S,
            delivery=Delivery.WEBHOOK,
            job_id=job_id,
        )
        if job is None:
            return "not claimed"
        hook = Webhook.objects.first()
        secret = services.webhook_secret(hook) if hook is not None else ""
    actor = system_actor("recovery-webhook")

    def fail(error: str, reason: str | None = None) -> None:
        failure = services.Failure(token=job.epoch, error=error, reason=reason)
        record(services.fail, tenant, job.pk, failure, actor=actor)

    if hook is None:
        fail("the webhook was removed", reason="no_handler")
        return "no webhook"
    body = delivery_body(job)
    try:
        status, _ = webhook.post(
            hook.url, body, secret=secret, idempotency_key=job.idempotency_key, agent="sagaplane-recovery"
        )
    except OSError as exc:
        fail(f"webhook unreachable: {exc}"[:500])
        return "unreachable"
    if 200 <= status < 300:
        record(services.complete, tenant, job.pk, services.Completion(token=job.epoch), actor=actor)
        return "delivered"
    fail(f"webhook answered HTTP {status}")
    return f"HTTP {status}"


def record(result: Callable[..., Job], tenant: Tenant, *args: Any, **kwargs: Any) -> Job:
    """A delivery's result (`services.complete` or `services.fail`), in a transaction of its own
    as the tenant, once the POST has answered."""
    with tenant_context(tenant):
        return result(tenant, *args, **kwargs)
