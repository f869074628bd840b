"""Read API for sagas: list with filters, and one saga with its steps and records in order."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.models import Record, RecordPayload, Redaction
from audit.services import stored_record
from sagas.models import Saga, SagaStatus
from sagas.services import mask_credentials
from tenants.errors import ApiError
from tenants.permissions import TenantScopedViewMixin


class SagaSerializer(serializers.ModelSerializer):
    status = serializers.SerializerMethodField()
    recorded_status = serializers.CharField(source="status")

    class Meta:
        model = Saga
        fields = [
            "saga_id",
            "name",
            "agent",
            "stream_id",
            "status",
            "recorded_status",
            "started_at",
            "last_activity_at",
            "last_lease_at",
            "lease_ttl",
            "lease_expires_at",
            "last_event",
            "record_count",
            "first_leaf_index",
            "last_leaf_index",
        ]

    def get_status(self, saga: Saga) -> str:
        return saga.effective_status(self.context.get("now"))


def _since(value: str) -> datetime:
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ApiError(400, "invalid", "since: an ISO 8601 time or epoch seconds", field="since")
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class SagaListView(TenantScopedViewMixin, generics.ListAPIView):
    """Sagas, most recently active first. `status` filters on the effective status (a running saga
    whose lease lapsed is `orphaned`), `tool` on any step's tool, `since` on last activity."""

    serializer_class = SagaSerializer
    required_scopes = {"GET": "read"}

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, enum=SagaStatus.values),
            OpenApiParameter("tool", str),
            OpenApiParameter("since", str, description="ISO 8601 time or epoch seconds"),
        ]
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "now": self._now}

    def get_queryset(self) -> QuerySet[Saga]:
        self._now = timezone.now()
        params = self.request.query_params
        sagas = Saga.objects.all()
        wanted = params.get("status")
        if wanted:
            if wanted not in SagaStatus.values:
                raise ApiError(
                    400, "invalid", f"status: one of {', '.join(SagaStatus.values)}", field="status"
                )
            if wanted == SagaStatus.ORPHANED:
                sagas = sagas.filter(status=SagaStatus.RUNNING, lease_expires_at__lt=self._now)
            elif wanted == SagaStatus.RUNNING:
                sagas = sagas.filter(status=SagaStatus.RUNNING).exclude(lease_expires_at__lt=self._now)
            else:
                sagas = sagas.filter(status=wanted)
        if params.get("tool"):
            sagas = sagas.filter(steps__tool=params["tool"]).distinct()
        if params.get("since"):
            sagas = sagas.filter(last_activity_at__gte=_since(params["since"]))
        return sagas.order_by("-last_activity_at", "-pk")


class SagaDetailView(TenantScopedViewMixin, APIView):
    """One saga: its steps (with compensation descriptors, credentials shown as references) and
    its records in log order, each with its leaf index (erased records as redacted stubs)."""

    required_scopes = {"GET": "read"}

    @extend_schema(
        operation_id="sagas_retrieve",
        responses={
            200: inline_serializer(
                "SagaDetail",
                {
                    "saga": SagaSerializer(),
                    "steps": serializers.ListField(child=serializers.DictField()),
                    "records": serializers.ListField(child=serializers.DictField()),
                },
            )
        },
    )
    def get(self, request: Request, saga_id: str) -> Response:
        saga = Saga.objects.filter(saga_id=saga_id).first()
        if saga is None:
            raise ApiError(404, "not_found", "no such saga")
        steps = [
            {
                "step_id": step.step_id,
                "ordinal": step.ordinal,
                "tool": step.tool,
                "semantics": step.semantics,
                "status": step.status,
                "compensation": mask_credentials(step.compensation),
                "first_leaf_index": step.first_leaf_index,
                "last_leaf_index": step.last_leaf_index,
            }
            for step in saga.steps.order_by("ordinal")
        ]
        records = list(Record.objects.select_related("stream").filter(saga_id=saga_id).order_by("leaf_index"))
        ids = [r.pk for r in records]
        payloads = {p.record_id: p for p in RecordPayload.objects.filter(record_id__in=ids)}
        erased = dict(Redaction.objects.filter(record_id__in=ids).values_list("record_id", "reason"))
        out = []
        for record in records:
            body = stored_record(record, payloads.get(record.pk), erased.get(record.pk))
            body = {
                k: (v if k.startswith("_") or k in ("seq", "ts", "event") else mask_credentials(v, k))
                for k, v in body.items()
            }
            out.append(
                {
                    "stream": record.stream.stream_id,
                    "position": record.position,
                    "leaf_index": record.leaf_index,
                    "redacted": record.pk not in payloads,
                    "record": body,
                }
            )
        return Response(
            {
                "saga": SagaSerializer(saga, context={"now": timezone.now()}).data,
                "steps": steps,
                "records": out,
            }
        )
