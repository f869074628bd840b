"""Celery: the lease sweep (run every second by the beat process's own thread, recovery/sweeper.py)
and webhook deliveries. Celery only wakes the
work: the job row's lease and fencing token decide who may record a result, so a lost, repeated
or late message never runs a compensation twice in the books (the receiver gets the same
`Idempotency-Key` on every attempt)."""

from __future__ import annotations

import json
import logging
import time

from celery import shared_task
from django.utils import timezone

from core.scoping import tenant_context
from recovery import services, sweeper, webhook
from recovery.cross_tenant import tenants_with_recovery_due, tenants_with_unclaimed_jobs
from recovery.models import Delivery, Webhook
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
            services.sweep(tenant, now=now)
            done += 1
        except Exception:
            failures += 1
            log.exception("recovery sweep of tenant %s failed; the next pass retries", tenant_id)
    sweeper.record_pass(started=began, tenants=len(due), failures=failures)
    return done


def delivery_body(job: object) -> bytes:
    from recovery.selectors import job_for_worker

    return json.dumps(job_for_worker(job), sort_keys=True, separators=(",", ":")).encode()


@shared_task(name="recovery.deliver_webhook", ignore_result=True, acks_late=True, reject_on_worker_lost=True)
@tenant_task(transaction=False)  # the POST waits outside any transaction
def deliver_webhook(tenant: Tenant, job_id: str) -> str:
    """Claim the job (as any worker would), POST it signed, and record the answer with the token
    the claim returned. Nothing to do when the claim fails: someone holds it, or it is not due."""
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
    actor = system_actor("recovery-webhook")
    with tenant_context(tenant):
        hook = Webhook.objects.first()
        secret = services.webhook_secret(hook) if hook is not None else ""
    if hook is None:
        services.fail(
            tenant, job.pk, token=job.epoch, actor=actor, error="the webhook was removed", reason="no_handler"
        )
        return "no webhook"
    body = delivery_body(job)
    try:
        status, _ = webhook.post(
            hook.url, body, secret=secret, idempotency_key=job.idempotency_key, agent="sagaplane-recovery"
        )
    except OSError as exc:
        services.fail(tenant, job.pk, token=job.epoch, actor=actor, error=f"webhook unreachable: {exc}"[:500])
        return "unreachable"
    if 200 <= status < 300:
        services.complete(tenant, job.pk, token=job.epoch, actor=actor)
        return "delivered"
    services.fail(tenant, job.pk, token=job.epoch, actor=actor, error=f"webhook answered HTTP {status}")
    return f"HTTP {status}"
