"""Recovery: the human queue (steps recovery could not compensate on its own, with why: no
handler, irreversible, retries exhausted, unknown outcome) with its decisions — retry, mark
resolved with a note, quarantine the saga — and the jobs in flight; and "Rollback to here" on a
saga's timeline, which compensates the steps after the chosen one by the same workers (the
timeline shows it live: each result is a record, and records refresh the page).

Reads through `recovery.selectors`; every decision goes through `recovery.services` (actor
`user:<name>`, recorded in the server stream). Same named rules as the API: RECOVERY_VIEW (any
member) to see, RECOVERY_DECIDE (risk staff) to decide."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.db.models import QuerySet
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from core.errors import DomainError
from core.numbers import ascii_int
from frontend import paging
from frontend.views import MemberRequest, actor_of, member_page, page
from recovery import selectors, services, sweeper
from recovery.models import Escalation, JobState
from sagas.models import Saga, StepStatus
from tenants.access import RECOVERY_DECIDE, RECOVERY_VIEW, decide
from tenants.models import Membership

PAGE_SIZE = paging.PAGE_SIZE
# The page's lists, each paged by `frontend.paging` (its rows, time, oldest first?): the human
# queue oldest first (the longest waiting on top), the others the latest first.
LISTS: dict[str, tuple[Callable[[], QuerySet[Any]], str, bool]] = {
    "queue": (selectors.human_queue, "escalated_at", True),
    "partial": (selectors.partial_rollbacks, "last_activity_at", False),
    "flight": (selectors.in_flight, "created_at", False),
    "done": (selectors.finished, "finished_at", False),
}
NEEDS_HUMAN_CAP = 10_000  # as the Sagas banner counts
# Why a step waits for a human, in words (Escalation values → explanation).
WHY = {
    Escalation.NO_HANDLER: (
        "No recoverable compensation: the step names no registered handler (or its arguments were not JSON)."
    ),
    Escalation.IRREVERSIBLE: "Irreversible: nothing undoes it, and it declared no compensation.",
    Escalation.RETRIES_EXHAUSTED: "Retries exhausted: every attempt failed, or its workers kept dying.",
    Escalation.UNKNOWN_OUTCOME: (
        "Outcome unknown: the agent died during the effect, which cannot be undone blindly."
    ),
}
ROLLBACK_FROM = (StepStatus.COMMITTED, StepStatus.UNKNOWN, StepStatus.COMPENSATION_FAILED)


def may_decide(membership: Membership) -> bool:
    return decide(RECOVERY_DECIDE, membership=membership) is None


def _pages(request: MemberRequest) -> dict[str, paging.Page]:
    """The page's four lists, each paged on its own (`<list>_before=` / `_after=`): a link of one
    keeps the others' places."""
    names = [f"{name}_{way}" for name in LISTS for way in ("before", "after")]
    held = {key: request.GET[key] for key in names if request.GET.get(key)}
    pages = {}
    for name, (rows, time_field, ascending) in LISTS.items():
        others = {k: v for k, v in held.items() if not k.startswith(f"{name}_")}
        pages[name] = paging.keyset(
            request,
            rows(),
            time_field,
            others,
            size=PAGE_SIZE,
            integer_id=name == "partial",
            name=f"{name}_",
            ascending=ascending,
        )
    return pages


@member_page({"GET": RECOVERY_VIEW}, section="recovery")
def recovery(request: MemberRequest) -> HttpResponse:
    pages = _pages(request)
    queue = pages["queue"].rows
    context = {
        "queue": [{"job": job, "why": WHY.get(Escalation(job.escalation), job.escalation)} for job in queue],
        # The Sagas banner's count, from the same selector: the two pages cannot disagree.
        "needs_human": selectors.needs_human_count(NEEDS_HUMAN_CAP),
        "partial": pages["partial"].rows,
        "sweep": sweeper.status(),
        "in_flight": pages["flight"].rows,
        "finished": pages["done"].rows,
        "pages": pages,
        "may_decide": may_decide(request.membership),
        "me": request.user.get_username(),
        "assignees": services.assignees() if queue else [],
    }
    return page(request, "frontend/recovery.html", context, section="recovery")


def _job(job_id: str) -> Any:
    try:
        pk = uuid.UUID(job_id)
    except ValueError:
        raise Http404("no such recovery job") from None
    job = selectors.job(pk)
    if job is None:
        raise Http404("no such recovery job")
    return job


def _back(request: MemberRequest) -> HttpResponse:
    return redirect(reverse("recovery") + "#queue")


@member_page({"POST": RECOVERY_DECIDE}, section="recovery")
def job_retry(request: MemberRequest, job_id: str) -> HttpResponse:
    job = _job(job_id)
    try:
        services.retry(request.tenant, job.pk, actor=actor_of(request))
    except DomainError as refused:
        messages.error(request, refused.detail)
        return _back(request)
    messages.success(request, f"Retrying: {job.tool or job.step_id} goes back to the recovery workers.")
    return _back(request)


@member_page({"POST": RECOVERY_DECIDE}, section="recovery")
def job_resolve(request: MemberRequest, job_id: str) -> HttpResponse:
    job = _job(job_id)
    try:
        resolution = services.ResolveJob.parse({"note": request.POST.get("note", "").strip()})
        services.resolve(request.tenant, job.pk, resolution, actor=actor_of(request))
    except DomainError as refused:
        messages.error(request, f"Not resolved: {refused.detail}")
        return _back(request)
    messages.success(request, f"Marked resolved: {job.tool or job.step_id} of {job.saga_id}.")
    return _back(request)


@member_page({"POST": RECOVERY_DECIDE}, section="recovery")
def job_assign(request: MemberRequest, job_id: str) -> HttpResponse:
    """Take up a job (acknowledge: the signed-in person) or hand it to another member, or to nobody."""
    job = _job(job_id)
    assignee = request.POST.get("assignee", "")
    try:
        assignment = services.AssignJob.parse({"assignee": assignee})
        services.assign(request.tenant, job.pk, assignment, actor=actor_of(request))
    except DomainError as refused:
        messages.error(request, f"Not assigned: {refused.detail}")
        return _back(request)
    who = "you" if assignee.strip() == request.user.get_username() else assignee.strip() or "nobody"
    messages.success(request, f"{job.tool or job.step_id} of {job.saga_id} is now with {who}.")
    return _back(request)


@member_page({"POST": RECOVERY_DECIDE}, section="recovery")
def saga_quarantine(request: MemberRequest, saga_id: str) -> HttpResponse:
    if not Saga.objects.filter(saga_id=saga_id).exists():
        raise Http404("no such saga")
    try:
        terms = services.QuarantineCreate.parse({"reason": request.POST.get("reason", "").strip()})
        services.quarantine(request.tenant, saga_id, terms, actor=actor_of(request))
    except DomainError as refused:
        messages.error(request, f"Not quarantined: {refused.detail}")
        return _back(request)
    messages.success(
        request, f"Quarantined {saga_id}: recovery leaves it alone and the gate refuses its steps."
    )
    return _back(request)


@member_page({"POST": RECOVERY_DECIDE}, section="sagas")
def saga_rollback(request: MemberRequest, saga_id: str) -> HttpResponse:
    if not Saga.objects.filter(saga_id=saga_id).exists():
        raise Http404("no such saga")
    detail = reverse("saga-detail", args=[saga_id])
    raw = request.POST.get("to_step", "")
    parsed = ascii_int(raw, max_digits=8)
    to_step = -1 if parsed is None else parsed
    try:
        rollback = services.RollbackSaga.parse({"to_step": to_step})
        run = services.rollback_to(request.tenant, saga_id, rollback, actor=actor_of(request))
    except DomainError as refused:
        messages.error(request, f"Not rolled back: {refused.detail}")
        return redirect(detail)
    count = run.jobs.count()
    messages.success(
        request,
        f"Rolling back to step {to_step}: {count} step(s) will be compensated, newest first, "
        "by the recovery workers.",
    )
    return redirect(detail + "#recovery")


def _left_to_undo(item: Any) -> bool:
    job = item.recovery_job
    return item.step.status in ROLLBACK_FROM and not (job is not None and job.state == JobState.RESOLVED)


def _irreversible_in(left: list[Any], ordinal: int) -> str:
    """The warning a rollback to step `ordinal` needs: the IRREVERSIBLE steps in its range."""
    steps = [
        item.step for item in left if item.step.ordinal > ordinal and item.step.semantics == "IRREVERSIBLE"
    ]
    if not steps:
        return ""
    named = ", ".join(f"step {s.ordinal} ({s.tool})" for s in steps)
    return f"{named} cannot be undone (IRREVERSIBLE): the rollback stops there for a person to resolve."


def saga_recovery(membership: Membership, saga: Saga, forward: list[Any]) -> dict[str, Any]:
    """What a saga's timeline shows of recovery: each step's latest job (set on its timeline item
    as `recovery_job`), the unfinished run, and whether this member may roll the saga back to a
    step (risk staff, with no run unfinished; the service refuses while the agent holds its lease)."""
    jobs = selectors.jobs_by_step(saga.saga_id)
    run = selectors.unfinished_run(saga.saga_id)
    may_rollback = may_decide(membership) and run is None
    for item in forward:
        item.recovery_job = jobs.get(item.step.step_id)
    # A step a person already resolved (an IRREVERSIBLE one, typically: its effect stands) is not
    # left to undo, or "Rollback to here" would be offered again after every rollback.
    left = [item for item in forward if _left_to_undo(item)]
    last_undoable = max((item.step.ordinal for item in left), default=0)
    for item in forward:
        # "Rollback to here" on each committed step with something after it left to undo.
        item.rollback_here = (
            may_rollback and item.step.status in ROLLBACK_FROM and item.step.ordinal < last_undoable
        )
        if item.rollback_here:
            item.rollback_warning = _irreversible_in(left, item.step.ordinal)
    return {"recovery_run": run, "recovery_jobs": list(jobs.values()), "may_rollback": may_rollback}
