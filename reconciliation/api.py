"""Reconciliation over HTTP (docs/ARCHITECTURE.md §8).

Observers (key scope `recovery`, the SDK's reconciler workers): `POST /api/v1/reconciliation/claim`
long-polls for checks of the handlers they observe; `POST /api/v1/reconciliation/checks/<id>/report`
answers one with the token its claim returned (409 `stale_token` when it is no longer current).
Readers: `GET /api/v1/reconciliation/report?since=` (what `sagaplane reconcile` decides on).
Auditors: `GET /api/v1/audit/certificate?since=` (the signed certificate, text/plain).
Risk staff: `POST /api/v1/reconciliation/checks/<id>/recheck`.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.schema import ErrorSerializer
from core import longpoll
from core.errors import DomainError, per_item
from reconciliation import selectors, services
from reconciliation.models import ReconciliationCheck
from tenants.access import AUDIT, READ, RECONCILE, RECONCILE_DECIDE
from tenants.permissions import TenantScopedViewMixin

POLL_S = 0.25
_EPOCH = re.compile(r"\d{1,11}(\.\d{1,6})?")
# Earliest and latest moments a range may name: anything else is a typo, not a range.
_FIRST = datetime(2000, 1, 1, tzinfo=UTC)
_LAST = datetime(9000, 1, 1, tzinfo=UTC)


def parse_moment(raw: str | None, name: str, *, required: bool) -> datetime | None:
    """An ISO 8601 date or time (UTC when no offset is given) or Unix seconds; 400 otherwise."""
    if raw is None or raw == "":
        if required:
            raise DomainError("invalid", f"{name}: required (ISO 8601 or Unix seconds)", field=name)
        return None
    moment: datetime | None = None
    if len(raw) <= 40 and raw.isascii():
        if _EPOCH.fullmatch(raw):
            try:
                moment = datetime.fromtimestamp(float(raw), tz=UTC)
            except (OverflowError, OSError, ValueError):
                moment = None
        else:
            try:
                moment = datetime.fromisoformat(raw.replace("Z", "+00:00") if raw.endswith("Z") else raw)
            except ValueError:
                moment = None
            if moment is not None and moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
    if moment is None or not _FIRST <= moment < _LAST:
        raise DomainError(
            "invalid", f"{name}: an ISO 8601 time (e.g. 2026-12-01T00:00:00Z) or Unix seconds", field=name
        )
    return moment


def parse_range(request: Request) -> tuple[datetime, datetime | None]:
    since = parse_moment(request.query_params.get("since"), "since", required=True)
    until = parse_moment(request.query_params.get("until"), "until", required=False)
    assert since is not None
    if until is not None and until <= since:
        raise DomainError("invalid", "until: must be later than since", field="until")
    return since, until


def check_json(check: ReconciliationCheck) -> dict[str, Any]:
    return {
        "id": str(check.pk),
        "token": check.token,
        "saga_id": check.saga_id,
        "step_id": check.step_id,
        "tool": check.tool,
        "handler": check.handler,
        "kwargs": check.kwargs,
        "idempotency_key": check.idempotency_key,
        "status": check.status,
        "lease_expires_at": check.lease_expires_at.isoformat() if check.lease_expires_at else None,
        "deadline": check.deadline.isoformat(),
    }


def _check_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise DomainError("not_found", "no such reconciliation check", status=404) from None


class ClaimView(TenantScopedViewMixin, APIView):
    """Checks this observer can answer: `{"handlers": [...], "worker"?, "max"? (1-50, default 10),
    "wait"? (0-25 s)}` → `{"checks": [{... "token"}]}`. Waits up to `wait` seconds for at least
    one; no transaction or connection is held while waiting."""

    access = {"POST": RECONCILE}

    @extend_schema(
        operation_id="reconciliation_claim",
        request=services.ReconciliationClaim,
        responses={200: inline_serializer("ReconciliationClaimed", {"checks": serializers.ListField()})},
    )
    def post(self, request: Request) -> Response:
        terms = services.ReconciliationClaim.parse(request.data)
        checks = services.claim(self.tenant, terms, actor=self.actor)
        return Response({"checks": [check_json(c) for c in checks]})

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        answer = super().dispatch
        return longpoll.poll(
            lambda: answer(request, *args, **kwargs),
            found=lambda data: bool(data.get("checks")),
            wait=longpoll.body_wait(request),
            interval=POLL_S,
        )


_VERDICT = inline_serializer(
    "ReconciliationVerdict",
    {
        "id": serializers.CharField(),
        "status": serializers.CharField(),
        "reason": serializers.CharField(),
    },
)


class ReportView(TenantScopedViewMixin, APIView):
    """The observer's answer: `{"token": <from the claim>, "reversed": true | false | null,
    "detail"?: str, "error"?: bool}`. true confirms the reversal, false is drift, null (it could
    not tell, or failed: `error`) is unverifiable."""

    access = {"POST": RECONCILE}

    @extend_schema(
        operation_id="reconciliation_report",
        request=services.ReportAnswer,
        responses={200: _VERDICT, 409: ErrorSerializer},
    )
    def post(self, request: Request, check_id: str) -> Response:
        # The URL's id before the body: a malformed one is a 404 whatever the body says. A
        # well-formed id of no check is the service's 404, after the body is judged, as before.
        check_uuid = _check_id(check_id)
        answer = services.ReportAnswer.parse(request.data)
        check = services.report(self.tenant, check_uuid, answer, actor=self.actor)
        return Response({"id": str(check.pk), "status": check.status, "reason": check.reason})


class AnswersView(TenantScopedViewMixin, APIView):
    """Several answers at once: `{"answers": [{"id", "token", "reversed", "detail"?, "error"?}]}`
    (1-500) → `{"answers": [{"id", "status", "reason"} | {"id", "error", "detail"}]}` in order,
    recorded in one transaction; an answer whose token is stale records nothing."""

    access = {"POST": RECONCILE}

    @extend_schema(
        operation_id="reconciliation_answers",
        request=services.ReconciliationAnswers,
        responses={
            200: inline_serializer(
                "ReconciliationVerdicts", {"answers": serializers.ListField(child=serializers.DictField())}
            ),
            400: ErrorSerializer,
        },
    )
    def post(self, request: Request) -> Response:
        answers = services.ReconciliationAnswers.parse(request.data).answers
        outcomes = services.report_many(self.tenant, answers, actor=self.actor)
        return Response(
            {
                "answers": per_item(
                    [{"id": a.given_id} for a in answers],
                    outcomes,
                    lambda check: {"id": str(check.pk), "status": check.status, "reason": check.reason},
                )
            }
        )


class RecheckView(TenantScopedViewMixin, APIView):
    """Open a decided check again (someone fixed the drift, or started the missing observer)."""

    access = {"POST": RECONCILE_DECIDE}

    @extend_schema(
        operation_id="reconciliation_recheck", request=None, responses={200: _VERDICT, 409: ErrorSerializer}
    )
    def post(self, request: Request, check_id: str) -> Response:
        check = services.recheck(self.tenant, _check_id(check_id), actor=self.actor)
        return Response({"id": str(check.pk), "status": check.status, "reason": check.reason})


class RangeReportView(TenantScopedViewMixin, APIView):
    """Every compensated step of the sagas active in [since, until) with its outcome:
    `confirmed`, `drift`, `unverifiable` or `pending` (no verdict yet, never counted as
    confirmed), the counts, and `outcome` (drift if any, else unverifiable if any is
    unverifiable or pending, else confirmed). `sagaplane reconcile --since` exits on it."""

    access = {"GET": READ}

    @extend_schema(
        operation_id="reconciliation_range_report",
        parameters=[OpenApiParameter("since", str, required=True), OpenApiParameter("until", str)],
        responses={
            200: inline_serializer(
                "ReconciliationRangeReport",
                {
                    "since": serializers.CharField(),
                    "until": serializers.CharField(),
                    "outcome": serializers.CharField(),
                    "counts": serializers.DictField(child=serializers.IntegerField()),
                    "items": serializers.ListField(child=serializers.DictField()),
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        since, until = parse_range(request)
        report = selectors.report(since, until)
        return Response(
            {
                "since": report.since.isoformat(),
                "until": report.until.isoformat(),
                "outcome": report.outcome,
                "counts": report.counts,
                "items": [item.as_json() for item in report.items],
            }
        )


class CertificateView(TenantScopedViewMixin, APIView):
    """A signed certificate (text/plain C2SP signed note, `sagaplane.certificate`) that every
    committed effect of the sagas active in [since, until) is accounted for, naming each
    exception. Verify it offline with `sagaplane certify --file ... --key <verifier key>`."""

    access = {"GET": AUDIT}

    @extend_schema(
        operation_id="audit_certificate",
        parameters=[OpenApiParameter("since", str, required=True), OpenApiParameter("until", str)],
        responses={(200, "text/plain"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> HttpResponse:
        since, until = parse_range(request)
        signed = services.issue_certificate(self.tenant, since, until, actor=self.actor)
        response = HttpResponse(signed, content_type="text/plain; charset=utf-8")
        response["Cache-Control"] = "no-store"
        return response
