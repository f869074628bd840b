"""Recovery over HTTP (shapes in docs/ARCHITECTURE.md §8.4).

Workers (key scope `recovery`): `POST /api/v1/recovery/claim` long-polls for the next job they
have a handler for; `POST /api/v1/recovery/jobs/<id>/complete`, `/fail` and `/heartbeat` carry
the token the claim returned (409 `stale_token` when it is no longer the job's). People (and
`control` keys): the jobs, the human queue's decisions, "rollback to here" and the webhook.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.http import HttpRequest
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.schema import ErrorSerializer
from core import longpoll
from core.actors import Actor
from core.errors import DomainError, per_item
from recovery import selectors, services
from sagas import selectors as saga_selectors
from tenants.access import RECOVER, RECOVERY_DECIDE, RECOVERY_SETUP, RECOVERY_VIEW
from tenants.models import Tenant
from tenants.permissions import TenantScopedViewMixin

C = TypeVar("C")
POLL_S = 0.1


class ClaimView(TenantScopedViewMixin, APIView):
    """Take the next job this worker has a handler for: `{"handlers": [...], "worker"?,
    "lease_s"? (1-300, default 30), "wait"? (0-25 s), "max_jobs"? (1-100)}` → `{"job": {...
    "token"} | null}`, and with `max_jobs` also `"jobs": [...]` (up to that many, each with its
    own token). Waits up to `wait` seconds for one; no transaction or connection is held while
    waiting.

    `"results"?` (the shape of `POST /recovery/results`) reports the worker's finished jobs in the
    same request: they are recorded first, once, in the transaction of the long-poll's first pass
    (not again on each later pass), and answered as `"results": [...]` beside the claim. A worker
    that runs one job at a time thus pays one request per job instead of two, and the older step
    its result unlocks is claimable by the same request."""

    access = {"POST": RECOVER}
    _reported: list[dict[str, Any]] | None = None  # the results' answers, from the first pass

    @extend_schema(
        operation_id="recovery_claim",
        request=services.RecoveryClaim,
        responses={
            200: inline_serializer(
                "RecoveryClaimed",
                {
                    "job": serializers.JSONField(allow_null=True),
                    "jobs": serializers.ListField(child=serializers.JSONField(), required=False),
                    "results": serializers.ListField(child=serializers.DictField(), required=False),
                },
            ),
            400: ErrorSerializer,
        },
    )
    def post(self, request: Request) -> Response:
        terms = services.RecoveryClaim.parse(request.data)
        if terms.results is not None and self._reported is None:
            self._reported = _report(self.tenant, terms.results, actor=self.actor)
        jobs = services.claim_many(
            self.tenant,
            worker=terms.worker or str(self.actor),
            handlers=terms.handlers,
            lease_s=terms.lease_s,
            max_jobs=terms.max_jobs or 1,
        )
        shown = [selectors.job_for_worker(job) for job in jobs]
        answer: dict[str, Any] = {"job": shown[0] if shown else None}
        if terms.max_jobs is not None:
            answer["jobs"] = shown
        if self._reported is not None:
            answer["results"] = self._reported
        return Response(answer)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        answer = super().dispatch
        return longpoll.poll(
            lambda: answer(request, *args, **kwargs),
            found=lambda data: data.get("job") is not None,
            wait=longpoll.body_wait(request),
            interval=POLL_S,
        )


_RESULT = inline_serializer(
    "RecoveryJobState", {"id": serializers.CharField(), "state": serializers.CharField()}
)


class CompleteView(TenantScopedViewMixin, APIView):
    """The compensation ran: `{"token"}`. 409 `stale_token` when the job was claimed again since."""

    access = {"POST": RECOVER}

    @extend_schema(
        operation_id="recovery_job_complete",
        request=services.CompleteJob,
        responses={200: _RESULT, 409: ErrorSerializer},
    )
    def post(self, request: Request, job_id: str) -> Response:
        job_pk, completion = _judged(job_id, lambda: services.CompleteJob.parse(request.data))
        job = services.complete(self.tenant, job_pk, completion, actor=self.actor)
        return Response({"id": str(job.pk), "state": job.state})


class FailView(TenantScopedViewMixin, APIView):
    """The compensation raised: `{"token", "error", "retryable"? (true), "reason"? ("no_handler")}`.
    Retried after a backoff while attempts remain, then escalated to the human queue."""

    access = {"POST": RECOVER}

    @extend_schema(
        operation_id="recovery_job_fail",
        request=services.FailJob,
        responses={200: _RESULT, 409: ErrorSerializer},
    )
    def post(self, request: Request, job_id: str) -> Response:
        job_pk, failure = _judged(job_id, lambda: services.FailJob.parse(request.data))
        job = services.fail(self.tenant, job_pk, failure, actor=self.actor)
        return Response({"id": str(job.pk), "state": job.state})


class ResultsView(TenantScopedViewMixin, APIView):
    """Several results at once: `{"results": [{"id", "token", "ok": true} | {"id", "token",
    "ok": false, "error", "retryable"?, "reason"?}]}` (1-500) → `{"results": [{"id", "state"} |
    {"id", "error", "detail"}]}` in the same order; an item whose token is stale records nothing
    and answers `stale_token`, the others are recorded in one transaction."""

    access = {"POST": RECOVER}

    @extend_schema(
        operation_id="recovery_results",
        request=services.RecoveryResults,
        responses={
            200: inline_serializer(
                "RecoveryResultStates", {"results": serializers.ListField(child=serializers.DictField())}
            ),
            400: ErrorSerializer,
        },
    )
    def post(self, request: Request) -> Response:
        results = services.RecoveryResults.parse(request.data).results
        return Response({"results": _report(self.tenant, results, actor=self.actor)})


def _report(tenant: Tenant, results: Sequence[services.JobResult], *, actor: Actor) -> list[dict[str, Any]]:
    """Record a worker's results (`services.report_many`): each one's answer, in order."""
    outcomes = services.report_many(tenant, results, actor=actor)
    given = [{"id": result.given_id} for result in results]
    return per_item(given, outcomes, lambda job: {"id": str(job.pk), "state": job.state})


class HeartbeatView(TenantScopedViewMixin, APIView):
    """Still working on it: `{"token", "lease_s"?}` extends the lease."""

    access = {"POST": RECOVER}

    @extend_schema(
        operation_id="recovery_job_heartbeat",
        request=services.HeartbeatJob,
        responses={200: _RESULT, 409: ErrorSerializer},
    )
    def post(self, request: Request, job_id: str) -> Response:
        job_pk, extension = _judged(job_id, lambda: services.HeartbeatJob.parse(request.data))
        job = services.heartbeat(self.tenant, job_pk, extension)
        return Response({"id": str(job.pk), "state": job.state})


def _existing_job(value: str) -> Any:
    """The id of the active tenant's job `value` names, else 404."""
    job = selectors.job(_uuid(value))
    if job is None:
        raise DomainError("not_found", "no such recovery job", status=404)
    return job.pk


def _uuid(value: str) -> Any:
    import uuid

    try:
        return uuid.UUID(value)
    except ValueError:
        raise DomainError("not_found", "no such recovery job", status=404) from None


def _judged(job_id: str, parse: Callable[[], C], *, found: Callable[[str], Any] = _uuid) -> tuple[Any, C]:
    """The path's job (`found`: its id, 404 if it names none) and the body's command (`parse`),
    refused in the order these views always kept: a body that is not a JSON object (400, field
    "body") first, then the path's job (404), then the body's fields (400). A worker's report
    finds its job by its id alone (its token is judged before the service looks it up); a
    decision's job is looked up before its body is judged."""
    try:
        command = parse()
    except DomainError as refused:
        if refused.field != "body":
            found(job_id)  # a 404 wins over a field at fault
        raise
    return found(job_id), command


class JobListView(TenantScopedViewMixin, APIView):
    """Recovery jobs, newest first: `?state=` (e.g. `escalated`: the human queue), `?saga_id=`."""

    access = {"GET": RECOVERY_VIEW}

    @extend_schema(
        operation_id="recovery_jobs_list",
        parameters=[OpenApiParameter("state", str), OpenApiParameter("saga_id", str)],
        responses={
            200: inline_serializer(
                "RecoveryJobs", {"jobs": serializers.ListField(child=serializers.DictField())}
            )
        },
    )
    def get(self, request: Request) -> Response:
        state = request.query_params.get("state", "")
        saga_id = request.query_params.get("saga_id", "")
        if len(state) > 20 or len(saga_id) > 128:
            raise DomainError("invalid", "state or saga_id too long", field="state")
        jobs = selectors.jobs(state=state, saga_id=saga_id)[:500]
        return Response({"jobs": [selectors.job_json(job) for job in jobs]})


class RetryView(TenantScopedViewMixin, APIView):
    """An escalated job goes back to the workers with fresh attempts."""

    access = {"POST": RECOVERY_DECIDE}

    @extend_schema(
        operation_id="recovery_job_retry",
        request=None,
        responses={200: serializers.DictField(), 409: ErrorSerializer},
    )
    def post(self, request: Request, job_id: str) -> Response:
        job = services.retry(self.tenant, _uuid(job_id), actor=self.actor)
        return Response(selectors.job_json(job))


class ResolveView(TenantScopedViewMixin, APIView):
    """A human dealt with this step: `{"note"}` (required; recorded in the server stream)."""

    access = {"POST": RECOVERY_DECIDE}

    @extend_schema(
        operation_id="recovery_job_resolve",
        request=services.ResolveJob,
        responses={200: serializers.DictField(), 409: ErrorSerializer},
    )
    def post(self, request: Request, job_id: str) -> Response:
        job_pk = _existing_job(job_id)  # 404 before the body is judged
        resolution = services.ResolveJob.parse(request.data)
        job = services.resolve(self.tenant, job_pk, resolution, actor=self.actor)
        return Response(selectors.job_json(job))


class AssignView(TenantScopedViewMixin, APIView):
    """Take up an escalated job: `{"assignee": "<member's username>"}` (a member who may decide
    recovery; acknowledging is naming yourself), or `""` for nobody. Recorded (RECOVERY_ASSIGNED)."""

    access = {"POST": RECOVERY_DECIDE}

    @extend_schema(
        operation_id="recovery_job_assign",
        request=services.AssignJob,
        responses={200: serializers.DictField(), 409: ErrorSerializer},
    )
    def post(self, request: Request, job_id: str) -> Response:
        job_pk, assignment = _judged(
            job_id, lambda: services.AssignJob.parse(request.data), found=_existing_job
        )
        job = services.assign(self.tenant, job_pk, assignment, actor=self.actor)
        return Response(selectors.job_json(job))


class RollbackView(TenantScopedViewMixin, APIView):
    """ "Rollback to here": `{"to_step": N}` compensates every step after step N (0: all), newest
    first, by the recovery workers. 409 while the agent holds its lease or a run is unfinished."""

    access = {"POST": RECOVERY_DECIDE}

    @extend_schema(
        operation_id="sagas_rollback",
        request=services.RollbackSaga,
        responses={201: serializers.DictField(), 409: ErrorSerializer},
    )
    def post(self, request: Request, saga_id: str) -> Response:
        if saga_selectors.saga(saga_id) is None:  # 404 before the body is judged
            raise DomainError("not_found", "no such saga", status=404)
        rollback = services.RollbackSaga.parse(request.data)
        run = services.rollback_to(self.tenant, saga_id, rollback, actor=self.actor)
        return Response(
            {"run_id": run.pk, "saga_id": run.saga_id, "to_step": run.to_ordinal, "state": run.state},
            status=201,
        )


class WebhookView(TenantScopedViewMixin, APIView):
    """Where compensations go instead of SDK workers. PUT `{"url", "handlers"?}` answers the new
    signing secret once; GET shows the URL and handlers; DELETE removes it."""

    access = {"GET": RECOVERY_SETUP, "PUT": RECOVERY_SETUP, "DELETE": RECOVERY_SETUP}

    @extend_schema(operation_id="recovery_webhook_retrieve", responses={200: serializers.DictField()})
    def get(self, request: Request) -> Response:
        hook = selectors.webhook()
        if hook is None:
            return Response({"url": None, "handlers": [], "actor": None})
        return Response({"url": hook.url, "handlers": hook.handlers, "actor": hook.actor})

    @extend_schema(
        operation_id="recovery_webhook_set",
        request=services.WebhookSet,
        responses={200: serializers.DictField()},
    )
    def put(self, request: Request) -> Response:
        new = services.WebhookSet.parse(request.data)
        hook, secret = services.set_webhook(self.tenant, new, actor=self.actor)
        return Response({"url": hook.url, "handlers": hook.handlers, "secret": secret})

    @extend_schema(operation_id="recovery_webhook_destroy", responses={204: None})
    def delete(self, request: Request) -> Response:
        services.delete_webhook(self.tenant, actor=self.actor)
        return Response(status=204)
