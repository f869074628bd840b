"""Every state change of reconciliation: checks made from compensated steps, claimed by observers,
answered with a verdict, expired at their deadline, re-opened by a person.

The pass (`reconciliation.tasks.reconcile_tenant`, the Celery beat's tick) turns each `COMPENSATED`
record in the log (an agent's own rollback or a recovery worker's, whichever compensated the step)
into one check for the step's compensation handler. An observer registered for that handler (an SDK
worker's `@sp.reconciler("shop.refund")`, claiming through the API) says whether the effect is
really reversed: true is `confirmed`, false is `drift`, and anything else (it could not tell, it
failed, nobody claimed the check before its deadline, the compensation has no handler name) is
`unverifiable`. Nothing is ever inferred to be fine.

Each verdict takes a keyword-only `actor` and appends a `RECONCILIATION_VERDICT` record (old and new
status, carrying the saga id) to the tenant's server stream in the same transaction.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from sagaplane import certificate as sdk_certificate
from sagaplane.events import Event

from audit import selectors as audit_selectors
from audit.jsonvalues import index_text
from audit.services import flush_server_records
from core.actionaudit import append_server_record, append_server_records
from core.actors import Actor
from core.errors import DomainError
from core.postcommit import after_commit
from core.scoping import require_tenant
from reconciliation import cross_tenant
from reconciliation.inputs import HANDLER_MAX, MAX_CLAIM, Answer, CheckAnswer, ClaimTerms
from reconciliation.inputs import ReconciliationAnswers as ReconciliationAnswers  # for the API
from reconciliation.inputs import ReconciliationClaim as ReconciliationClaim  # for the API
from reconciliation.inputs import ReportAnswer as ReportAnswer  # for the API
from reconciliation.leases import CHECKS, WORKER_MAX, claim_due
from reconciliation.models import (
    OPEN_STATUSES,
    CheckStatus,
    Reason,
    ReconciliationCheck,
    ReconciliationCursor,
)
from sagas import selectors as saga_selectors
from tenants.actors import system_actor
from tenants.models import Tenant

log = logging.getLogger(__name__)

VERDICT_EVENT = Event.RECONCILIATION_VERDICT
RECHECK_EVENT = Event.RECONCILIATION_RECHECK
PASS_ACTOR = system_actor("reconciliation")
COMPENSATED_EVENTS = (Event.COMPENSATED,)
# One pass looks at most this many new leaves per tenant; the next tick goes on from there.
SCAN_LEAVES = 50_000
DETAIL_MAX = 500


def _delay() -> timedelta:
    return timedelta(seconds=settings.SAGAPLANE_RECONCILE_DELAY_SECONDS)


def _window() -> timedelta:
    return timedelta(seconds=settings.SAGAPLANE_RECONCILE_WINDOW_SECONDS)


def _clean(text: Any, limit: int) -> str:
    return index_text(str(text))[:limit] if text is not None else ""


# ------------------------------------------------------------------------------------- verdicts


def _decide(
    tenant: Tenant,
    check: ReconciliationCheck,
    status: str,
    reason: str,
    detail: str,
    *,
    observer: str,
    actor: Actor,
    batch: list[tuple[str, dict[str, Any]]] | None = None,
) -> None:
    """Give `check` its verdict and record it, in the caller's transaction (the row is locked).
    With `batch`, the record is added to it for the caller to append with the others (one
    server-stream append for many verdicts) before its transaction ends."""
    old = {"status": check.status, "reason": check.reason or None}
    check.status = status
    check.reason = reason
    check.detail = detail[:DETAIL_MAX]
    check.observer = observer[:WORKER_MAX]
    check.decided_at = timezone.now()
    check.lease_expires_at = None
    check.save(update_fields=["status", "reason", "detail", "observer", "decided_at", "lease_expires_at"])
    record = (
        VERDICT_EVENT,
        {
            "saga_id": check.saga_id,
            "step_id": check.step_id,
            "tool": check.tool,
            "handler": check.handler,
            "check": str(check.pk),
            "verdict": status,
            "reason": reason,
            "detail": check.detail,
            "observer": check.observer,
            "token": check.token,
            "old": old,
            "new": {"status": status, "reason": reason},
        },
    )
    if batch is None:
        append_server_records(tenant, [record], actor=actor)
    else:
        batch.append(record)


# ----------------------------------------------------------------------------------------- the pass


def _locked_cursor(tenant: Tenant) -> ReconciliationCursor:
    cursor = ReconciliationCursor.objects.select_for_update().filter(tenant=tenant).first()
    if cursor is not None:
        return cursor
    try:
        with transaction.atomic():
            ReconciliationCursor.objects.create(tenant=tenant)
    except IntegrityError:
        pass  # another pass created it meanwhile
    return ReconciliationCursor.objects.select_for_update().get(tenant=tenant)


def _check_for(
    tenant: Tenant, header: Any, compensation: dict[str, Any] | None, now: datetime
) -> ReconciliationCheck:
    comp = compensation or {}
    handler = comp.get("handler")
    kwargs = comp.get("kwargs")
    key = comp.get("idempotency_key")
    return ReconciliationCheck(
        tenant=tenant,
        saga_id=header.saga_id,
        step_id=header.step_id,
        tool=header.tool,
        handler=_clean(handler, HANDLER_MAX) if isinstance(handler, str) else "",
        kwargs=kwargs if isinstance(kwargs, dict) else {},
        idempotency_key=_clean(key, 128) if isinstance(key, str) else "",
        compensated_leaf=header.leaf_index,
        compensated_in=header.stream_id,
        created_at=now,
        not_before=now + _delay(),
        deadline=now + _delay() + _window(),
    )


def scan(tenant: Tenant, *, max_leaves: int = SCAN_LEAVES) -> list[ReconciliationCheck]:
    """Make a check for every step compensated in the leaves past the tenant's watermark (at most
    `max_leaves` of them), then move the watermark, in the caller's transaction as the tenant
    (asserted: the pass enters it, reconciliation.tasks.reconcile_tenant). A compensation with no
    handler name gets its verdict at once: no observer can ever be registered for it."""
    require_tenant(tenant)
    cursor = _locked_cursor(tenant)
    # The size first: every leaf below it is committed (indices are assigned in commit order).
    size = audit_selectors.log_size()
    if size <= cursor.scanned:
        return []
    end = min(size, cursor.scanned + max_leaves)
    headers = [
        h
        for h in audit_selectors.headers_between(cursor.scanned, end, COMPENSATED_EVENTS)
        if h.saga_id and h.step_id
    ]
    created: list[ReconciliationCheck] = []
    if headers:
        pairs = list(dict.fromkeys((h.saga_id, h.step_id) for h in headers))
        known = set(
            ReconciliationCheck.objects.filter(saga_id__in={s for s, _ in pairs}).values_list(
                "saga_id", "step_id"
            )
        )
        compensations = saga_selectors.step_compensations([p for p in pairs if p not in known])
        now = timezone.now()
        fresh: dict[tuple[str, str], ReconciliationCheck] = {}
        for header in headers:
            pair = (header.saga_id, header.step_id)
            if pair in known or pair in fresh:
                continue  # compensated again (by a recovery worker after its agent): one check
            fresh[pair] = _check_for(tenant, header, compensations.get(pair), now)
        created = list(fresh.values())
        ReconciliationCheck.objects.bulk_create(created, batch_size=1000)
        verdicts: list[tuple[str, dict[str, Any]]] = []
        for check in created:
            if not check.handler:
                _decide(
                    tenant,
                    check,
                    CheckStatus.UNVERIFIABLE,
                    Reason.NO_HANDLER,
                    "the compensation names no registered handler, so no observer can check it",
                    observer="",
                    actor=PASS_ACTOR,
                    batch=verdicts,
                )
        if verdicts:
            append_server_records(tenant, verdicts, actor=PASS_ACTOR)
    ReconciliationCursor.objects.filter(pk=cursor.pk).update(scanned=end)
    return created


def expire_overdue(tenant: Tenant, *, now: datetime | None = None, limit: int = 1000) -> int:
    """Checks still open at their deadline become `unverifiable`: nobody claimed them (no observer
    for the handler) or the observer that claimed them never answered."""
    now = now or timezone.now()
    require_tenant(tenant)
    overdue = list(
        ReconciliationCheck.objects.select_for_update(skip_locked=True)
        .filter(status__in=OPEN_STATUSES, deadline__lte=now)
        .order_by("deadline")[:limit]
    )
    verdicts: list[tuple[str, dict[str, Any]]] = []
    for check in overdue:
        if check.token == 0:
            reason, detail = Reason.NO_OBSERVER, f"no observer for {check.handler!r} claimed it in time"
        else:
            reason = Reason.OBSERVER_SILENT
            detail = f"claimed by {check.claimed_by or 'a worker'} and never answered"
        _decide(
            tenant,
            check,
            CheckStatus.UNVERIFIABLE,
            reason,
            detail,
            observer="",
            actor=PASS_ACTOR,
            batch=verdicts,
        )
    if verdicts:
        append_server_records(tenant, verdicts, actor=PASS_ACTOR)
    return len(overdue)


def tenants_to_reconcile(now: datetime | None = None) -> list[int]:
    return cross_tenant.tenants_to_reconcile(now or timezone.now())


# ---------------------------------------------------------------------------------- observers


def claim(tenant: Tenant, terms: ClaimTerms, *, actor: Actor) -> list[ReconciliationCheck]:
    """Up to `terms.max` due checks for `terms.handlers` (`terms` from `ReconciliationClaim`), each
    claimed under a new fencing token with a lease, for `terms.worker` (None: the actor). A check
    whose lease lapsed is claimable again (its old token is then stale). Claims are operational,
    not evidence: the verdict's record names the observer and the token it held."""
    worker = str(actor) if terms.worker is None else terms.worker
    require_tenant(tenant)
    return claim_due(list(terms.handlers), worker=worker, limit=max(1, min(terms.max, MAX_CLAIM)))


# ----------------------------------------------------------------------------------- the webhook

WEBHOOK_OBSERVER = "webhook"
WEBHOOK_ACTOR = system_actor("reconciliation-webhook")
WEBHOOK_BATCH = 100


def claim_for_webhook(tenant: Tenant) -> list[tuple[str, int]]:
    """When the tenant has a webhook (recovery's: the endpoint it answers compensations with), the
    due checks of the handlers it serves (all, when it names none) are claimed for it, and their
    deliveries are queued after commit: (check id, token) of each. A delivery that fails leaves the
    claim to lapse, and the next pass claims the check again, until its deadline."""
    from recovery import selectors as recovery_selectors

    require_tenant(tenant)
    hook = recovery_selectors.webhook()
    if hook is None:
        return []
    handlers = list(hook.handlers) or None
    claimed = claim_due(handlers, worker=WEBHOOK_OBSERVER, limit=WEBHOOK_BATCH)
    due = [(str(c.pk), c.token) for c in claimed]
    if due:
        tenant_id = tenant.pk

        def enqueue() -> None:
            from reconciliation.tasks import deliver_check

            for check_id, token in due:
                deliver_check.delay(tenant_id, check_id, token)

        after_commit(f"reconciliation webhook deliveries for tenant {tenant_id}", enqueue)
    return due


def report(tenant: Tenant, check_id: uuid.UUID, answer: Answer, *, actor: Actor) -> ReconciliationCheck:
    """The observer's answer for a check it holds (`answer` from `ReportAnswer`): reversed true
    (confirmed), false (drift) or None (unverifiable: it could not tell, or `error`: it failed).
    Refused unless its token is the check's current token and the check is still claimed (409
    `stale_token`), so a worker whose lease lapsed and was taken over cannot record a verdict."""
    (outcome,) = _report_all(tenant, [(check_id, answer)], actor=actor)
    if isinstance(outcome, DomainError):
        raise outcome
    return outcome


def report_many(
    tenant: Tenant, answers: Sequence[CheckAnswer], *, actor: Actor
) -> list[ReconciliationCheck | DomainError]:
    """Several answers (from `ReconciliationAnswers`) in one transaction and one server-stream
    append, each judged as `report` judges one: an answer whose token no longer holds its check
    records nothing and comes back as its error, in the order given."""
    return _report_all(tenant, [(a.check_id, a.answer) for a in answers], actor=actor)


def _report_all(
    tenant: Tenant, items: list[tuple[uuid.UUID, Answer]], *, actor: Actor
) -> list[ReconciliationCheck | DomainError]:
    require_tenant(tenant)
    checks = {
        check.pk: check
        for check in ReconciliationCheck.objects.select_for_update()
        .filter(pk__in=[item[0] for item in items])
        .order_by("pk")
    }
    verdicts: list[tuple[str, dict[str, Any]]] = []
    outcomes: list[ReconciliationCheck | DomainError] = []
    for check_id, answer in items:
        check = checks.get(check_id)
        if check is None:
            outcomes.append(DomainError("not_found", "no such reconciliation check", status=404))
            continue
        if check.decided:
            outcomes.append(
                DomainError(
                    "already_decided", f"the check already has its verdict ({check.status})", status=409
                )
            )
            continue
        if not CHECKS.holds(check, answer.token):
            outcomes.append(
                DomainError(
                    "stale_token",
                    "this claim is no longer current (its lease lapsed and the check was re-claimed)",
                    status=409,
                )
            )
            continue
        if answer.reversed is True:
            status, reason = CheckStatus.CONFIRMED, Reason.REVERSED
        elif answer.reversed is False:
            status, reason = CheckStatus.DRIFT, Reason.NOT_REVERSED
        else:
            status = CheckStatus.UNVERIFIABLE
            reason = Reason.OBSERVER_ERROR if answer.error else Reason.OBSERVER_UNKNOWN
        _decide(
            tenant,
            check,
            status,
            reason,
            _clean(answer.detail, DETAIL_MAX),
            observer=check.claimed_by,
            actor=actor,
            batch=verdicts,
        )
        outcomes.append(check)
    if verdicts:
        append_server_records(tenant, verdicts, actor=actor)
    return outcomes


def recheck(tenant: Tenant, check_id: uuid.UUID, *, actor: Actor) -> ReconciliationCheck:
    """Open a decided check again (after someone fixed the drift, or started the missing
    observer): a new deadline, the next claim gets a new token. Recorded with the verdict it
    replaces."""
    require_tenant(tenant)
    with transaction.atomic():
        check = ReconciliationCheck.objects.select_for_update().filter(pk=check_id).first()
        if check is None:
            raise DomainError("not_found", "no such reconciliation check", status=404)
        if not check.decided:
            raise DomainError("not_decided", "the check is still waiting for its verdict", status=409)
        if not check.handler:
            raise DomainError(
                "no_handler", "the compensation names no handler: no observer can check it", status=409
            )
        old = {"status": check.status, "reason": check.reason}
        now = timezone.now()
        check.status = CheckStatus.PENDING
        check.reason = ""
        check.detail = ""
        check.observer = ""
        check.decided_at = None
        check.not_before = now
        check.deadline = now + _window()
        check.save(
            update_fields=["status", "reason", "detail", "observer", "decided_at", "not_before", "deadline"]
        )
        append_server_record(
            tenant,
            RECHECK_EVENT,
            {
                "saga_id": check.saga_id,
                "step_id": check.step_id,
                "tool": check.tool,
                "handler": check.handler,
                "check": str(check.pk),
                "old": old,
                "new": {"status": CheckStatus.PENDING.value, "reason": None},
            },
            actor=actor,
        )
        return check


# ---------------------------------------------------------------------------------- certificate

CERTIFICATE_EVENT = Event.AUDIT_CERTIFICATE_ISSUED


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def issue_certificate(tenant: Tenant, since: datetime, until: datetime | None = None, *, actor: Actor) -> str:
    """A signed statement (`sagaplane.certificate`, signed like a checkpoint by the tenant's log
    key) that every committed effect of the sagas active in [since, until) is accounted for,
    naming each exception. Handing one out is recorded in the server stream (range, counts, the
    note's SHA-256), like an export download."""
    from reconciliation import certificate
    from reconciliation import selectors as own
    from transparency import selectors as log_selectors
    from transparency import services as transparency

    require_tenant(tenant)
    flush_server_records(tenant, wait=True)  # every accepted result counts, chained or pending
    now = timezone.now()
    until = min(until or now, now)
    checkpoint = log_selectors.latest_checkpoint()
    if checkpoint is None:
        raise DomainError("no_checkpoint", "the log has no signed checkpoint yet", status=404)
    steps = saga_selectors.step_count_between(since, until)
    if steps > own.MAX_STEPS:
        raise own.range_too_large(steps)
    effects = saga_selectors.effects_between(since, until, now=now, limit=own.MAX_STEPS)
    checks = own.checks_for((e.saga_id, e.step_id) for e in effects if e.status == "compensated")
    tally = certificate.tally(effects, checks, resolved_steps(effects))
    statement = {
        "v": 1,
        "since": _iso(since),
        "until": _iso(until),
        "issued_at": _iso(now),
        "log": {
            "size": checkpoint.size,
            "root": base64.b64encode(bytes(checkpoint.root)).decode("ascii"),
        },
        "effects": tally.effects,
        "accounted": tally.accounted,
        "exceptions": tally.exceptions,
        "clean": not tally.exceptions,
    }
    text = sdk_certificate.format_statement(transparency.log_origin(tenant), statement)
    signed = transparency.sign_statement(tenant, text)
    append_server_record(
        tenant,
        CERTIFICATE_EVENT,
        {
            "since": statement["since"],
            "until": statement["until"],
            "log_size": checkpoint.size,
            "effects": tally.effects,
            "exceptions": len(tally.exceptions),
            "sha256": hashlib.sha256(signed.encode("utf-8")).hexdigest(),
        },
        actor=actor,
    )
    return signed


def resolved_steps(effects: list[Any]) -> set[tuple[str, str]]:
    """(saga id, step id) of the effects a person made explicitly terminal: a recovery job
    resolved from the human queue with a note (recorded as RECOVERY_RESOLVED)."""
    from recovery import selectors as recovery_selectors
    from recovery.models import JobState

    saga_ids = sorted({e.saga_id for e in effects})
    resolved: set[tuple[str, str]] = set()
    for start in range(0, len(saga_ids), 500):
        rows = (
            recovery_selectors.jobs(state=JobState.RESOLVED)
            .filter(saga_id__in=saga_ids[start : start + 500])
            .values_list("saga_id", "step_id")
        )
        resolved.update(rows)
    return resolved
