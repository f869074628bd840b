"""agent-saga compatible endpoints (`SagaCloudClient`, endpoint `<server>/v1`).

agent-saga's own control plane stores whatever it is sent; here the same payload is verified
exactly like `/api/v1/streams/<id>/records`, attached to streams by chain linkage."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import Count
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit import services
from audit.api import CHAIN_ERROR, ERROR, RECORDS_BODY, read_json_body, records_from_body, refusal
from audit.models import Record, Stream
from sagas.models import Saga
from tenants.errors import ApiError
from tenants.permissions import TenantScopedViewMixin


class WalIngestView(TenantScopedViewMixin, APIView):
    """`SagaCloudClient.push_wal_records`: verified, all or nothing."""

    required_scopes = {"POST": "ingest"}
    required_capability = {"POST": "ingest"}  # no role has it: agents' keys only

    @extend_schema(
        operation_id="agent_saga_wal_ingest",
        request=RECORDS_BODY,
        responses={
            200: inline_serializer(
                "WalIngestAccepted",
                {
                    "status": serializers.CharField(),
                    "records_ingested": serializers.IntegerField(),
                    "duplicates": serializers.IntegerField(),
                    "streams": serializers.ListField(child=serializers.DictField()),
                },
            ),
            400: ERROR,
            409: CHAIN_ERROR,
            413: ERROR,
            422: CHAIN_ERROR,
        },
    )
    def post(self, request: Request) -> Response:
        records = records_from_body(read_json_body(request))
        try:
            results = services.ingest_by_linkage(self.tenant, records, actor=self.actor)
        except services.IngestRefused as exc:
            raise refusal(exc)
        return Response(
            {
                "status": "accepted",
                "records_ingested": sum(r.accepted for r in results),
                "duplicates": sum(r.duplicates for r in results),
                "streams": [r.as_dict() for r in results],
            }
        )


class ApprovalsView(TenantScopedViewMixin, APIView):
    """`SagaCloudClient.pull_approvals`: the approval queue (approvals arrive with their own issue;
    until then the queue is empty, in the shape the client reads)."""

    required_scopes = {"GET": "read"}

    @extend_schema(
        operation_id="agent_saga_approvals",
        parameters=[OpenApiParameter("status", str, description="pending, granted, denied")],
        responses={
            200: inline_serializer(
                "AgentSagaApprovals",
                {
                    "approvals": serializers.ListField(child=serializers.DictField()),
                    "status": serializers.CharField(),
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        wanted = request.query_params.get("status", "pending")
        return Response({"status": wanted, "approvals": []})


class FleetBudgetView(TenantScopedViewMixin, APIView):
    """`SagaCloudClient.get_fleet_budget`: what the fleet has recorded (budgets proper come with
    the fleet issue)."""

    required_scopes = {"GET": "read"}

    @extend_schema(
        operation_id="agent_saga_fleet_budget",
        parameters=[OpenApiParameter("window", float, description="seconds (accepted, not yet applied)")],
        responses={
            200: inline_serializer(
                "AgentSagaFleetBudget",
                {
                    "status": serializers.CharField(),
                    "budgets": serializers.ListField(child=serializers.DictField()),
                    "sagas": serializers.DictField(child=serializers.IntegerField()),
                    "records": serializers.IntegerField(),
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        by_status = dict(
            Saga.objects.values_list("status").annotate(n=Count("pk")).values_list("status", "n")
        )
        return Response(
            {
                "status": "ok",
                "window": request.query_params.get("window"),
                "budgets": [],
                "sagas": by_status,
                "records": Record.objects.count(),
                "streams": Stream.objects.count(),
            }
        )


def _moment(value: str | None, name: str) -> datetime | None:
    if value in (None, ""):
        return None
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ApiError(400, "invalid", f"{name}: an ISO 8601 time or epoch seconds", field=name)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class AuditReportView(TenantScopedViewMixin, APIView):
    """`SagaCloudClient.get_audit_report`: report metadata for [start, end] (the WORM export
    arrives with the transparency-log issue; this reports counts of what is held)."""

    required_scopes = {"GET": "read"}

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # The client's `format=csv` names the report's format, not DRF's URL format override.
        return super().perform_content_negotiation(request, force=True)

    @extend_schema(
        operation_id="agent_saga_audit_report",
        parameters=[
            OpenApiParameter("start", str),
            OpenApiParameter("end", str),
            OpenApiParameter("format", str),
        ],
        responses={
            200: inline_serializer(
                "AgentSagaAuditReport",
                {
                    "status": serializers.CharField(),
                    "records": serializers.IntegerField(),
                    "sagas": serializers.IntegerField(),
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        start = _moment(request.query_params.get("start"), "start")
        end = _moment(request.query_params.get("end"), "end")
        records = Record.objects.all()
        sagas = Saga.objects.all()
        if start is not None:
            records = records.filter(ts__gte=start.timestamp())
            sagas = sagas.filter(last_activity_at__gte=start)
        if end is not None:
            records = records.filter(ts__lte=end.timestamp())
            sagas = sagas.filter(started_at__lte=end)
        fmt: Any = request.query_params.get("format", "csv")
        return Response(
            {
                "status": "ready",
                "format": fmt,
                "start": start,
                "end": end,
                "records": records.count(),
                "redacted": records.exclude(redacted="").count(),
                "sagas": sagas.count(),
                "streams": Stream.objects.count(),
                "download_url": None,
            }
        )
