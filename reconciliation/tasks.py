"""The reconciliation pass, as a Celery beat task (after recovery: it looks only at steps already
compensated, by their agent or by a recovery worker)."""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import shared_task

from audit.services import chain_pending_server_records
from core.errors import DomainError
from core.scoping import tenant_context
from core.shutdown import keep_going
from reconciliation import services
from reconciliation.inputs import Answer
from reconciliation.models import CheckStatus, ReconciliationCheck
from tenants.entry import tenant_by_id, tenant_task
from tenants.models import Tenant

log = logging.getLogger(__name__)


@shared_task(name="reconciliation.reconcile", ignore_result=True)
def reconcile() -> dict[str, int]:
    """Every tenant with work: new compensations become checks, overdue checks unverifiable. One
    tenant's failure is logged and does not stop the others."""
    totals = {"tenants": 0, "created": 0, "expired": 0, "webhook": 0}
    for tenant_id in services.tenants_to_reconcile():
        if not keep_going():
            break
        tenant = tenant_by_id(tenant_id)
        if tenant is None:
            continue
        try:
            done = reconcile_tenant(tenant)
        except Exception:
            log.exception("reconciliation of tenant %s failed; the next tick tries again", tenant_id)
            continue
        totals["tenants"] += 1
        totals["created"] += done["created"]
        totals["expired"] += done["expired"]
        totals["webhook"] += done["webhook"]
    return totals


def reconcile_tenant(tenant: Tenant) -> dict[str, int]:
    """One pass over a tenant, each step a transaction of its own as the tenant: new checks from
    new compensations, then overdue checks expired, then due checks claimed for the webhook."""
    chain_pending_server_records(tenant, wait=True)  # compensations whose records are still pending
    with tenant_context(tenant):
        created = services.scan(tenant)
    with tenant_context(tenant):
        expired = services.expire_overdue(tenant)
    with tenant_context(tenant):
        delivered = services.claim_for_webhook(tenant)
    return {"created": len(created), "expired": expired, "webhook": len(delivered)}


ANSWER_MAX_BYTES = 64 * 1024


def delivery_body(check: ReconciliationCheck) -> bytes:
    from reconciliation.api import check_json

    return json.dumps(
        {"type": "reconciliation.check", "check": check_json(check)}, sort_keys=True, separators=(",", ":")
    ).encode()


@shared_task(
    name="reconciliation.deliver_check", ignore_result=True, acks_late=True, reject_on_worker_lost=True
)
@tenant_task(transaction=False)  # the POST waits outside any transaction
def deliver_check(tenant: Tenant, check_id: str, token: int) -> str:
    """POST one claimed check to the tenant's webhook, signed as recovery's deliveries are
    (Standard Webhooks headers, the same secret), and record its answer `{"reversed": true | false |
    null}` with the token the claim took. A failed delivery records nothing: the claim lapses and
    the next pass offers the check again, until its deadline makes it unverifiable."""
    from recovery import selectors as recovery_selectors
    from recovery import services as recovery_services
    from recovery import webhook

    with tenant_context(tenant):
        check = ReconciliationCheck.objects.filter(pk=check_id).first()
        hook = recovery_selectors.webhook()
        secret = recovery_services.webhook_secret(hook) if hook is not None else ""
    if check is None or check.token != token or check.status != CheckStatus.CLAIMED:
        return "not current"
    if hook is None:
        return "no webhook"
    body = delivery_body(check)
    try:
        status, raw = webhook.post(
            hook.url,
            body,
            secret=secret,
            idempotency_key=f"reconcile-{check.pk}-{token}",
            agent="sagaplane-reconciliation",
            read=ANSWER_MAX_BYTES + 1,
        )
    except OSError as exc:
        log.info("reconciliation webhook unreachable for check %s: %s", check_id, exc)
        return "unreachable"
    if not 200 <= status < 300:
        return f"HTTP {status}"
    answer: Any = None
    detail = ""
    try:
        parsed = json.loads(raw) if len(raw) <= ANSWER_MAX_BYTES else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and "reversed" in parsed and parsed["reversed"] in (True, False, None):
        answer = (
            parsed["reversed"] if isinstance(parsed["reversed"], bool) or parsed["reversed"] is None else None
        )
        if isinstance(parsed.get("detail"), str):
            detail = parsed["detail"]
    else:
        detail = 'the webhook answered without a verdict ({"reversed": true | false | null})'
    try:
        with tenant_context(tenant):  # the answer's own transaction, once the POST has answered
            services.report(tenant, check.pk, Answer(token, answer, detail), actor=services.WEBHOOK_ACTOR)
    except DomainError as refused:  # re-claimed meanwhile, or decided
        return refused.code
    return "answered"
