"""agent-saga compatible reads that count sagas (`SagaCloudClient`, endpoint `<server>/v1`); the
fleet budget read is `fleet.compat`.

They live here, not in `audit.compat`, because they read the saga projection and `audit` imports
no app above it; `sagas/compat_urls.py` mounts them under the same `/v1/` paths."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.models import Record, Stream
from sagas import selectors
from sagas.api import parse_moment
from tenants.access import READ
from tenants.permissions import TenantScopedViewMixin


def _moment(value: str | None, name: str) -> datetime | None:
    if value in (None, ""):
        return None
    return parse_moment(value, name)


class AuditReportView(TenantScopedViewMixin, APIView):
    """`SagaCloudClient.get_audit_report`: report metadata for [start, end] (the WORM export
    arrives with the transparency-log issue; this reports counts of what is held)."""

    access = {"GET": READ}

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
        sagas = selectors.all_sagas()
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
