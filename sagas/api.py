"""Read API for sagas: list with filters, and one saga with its steps and records in order."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import generics, serializers
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit import selectors as audit_selectors
from audit.jsonvalues import served
from core.errors import DomainError
from core.numbers import ascii_int
from sagas import selectors
from sagas.models import Saga, SagaStatus
from sagas.queries import SAGA_FIELDS
from sagas.services import mask_credentials
from tenants.access import READ
from tenants.permissions import TenantScopedViewMixin


class SagaSerializer(serializers.ModelSerializer):
    status = serializers.SerializerMethodField()
    recorded_status = serializers.CharField(source="status")

    class Meta:
        model = Saga
        # The projected columns (one list: sagas/queries.py); `status` is the effective one.
        fields = ["saga_id", "stream_id", "recorded_status", *SAGA_FIELDS]

    def get_status(self, saga: Saga) -> str:
        return saga.effective_status(self.context.get("now"))


def parse_moment(value: str, name: str) -> datetime:
    """A query parameter holding epoch seconds or an ISO 8601 time, as an aware UTC datetime.
    Anything else, or a moment no datetime can hold (`1e20`, `-inf`, `nan`), is a 400."""
    try:
        seconds: float | None = float(value)
    except ValueError:
        seconds = None
    try:
        if seconds is not None:
            return datetime.fromtimestamp(seconds, tz=UTC)
        moment = datetime.fromisoformat(value)
        return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    except (ValueError, OverflowError, OSError):
        raise DomainError(
            "invalid", f"{name}: an ISO 8601 time or epoch seconds within years 1-9999", field=name
        ) from None


def _since(value: str) -> datetime:
    return parse_moment(value, "since")


PAGE_SIZE = 50
MAX_LIMIT = 500  # the bound of the other lists (controlplane.pagination, a layer above this app)


def _position(cursor: str) -> tuple[datetime | None, int]:
    """(last activity, id) of the saga a cursor was made from; anything else is a 400."""
    try:
        return selectors.cursor_position(cursor)
    except selectors.BadCursor:
        raise DomainError("invalid", "cursor: a `next` link's cursor, unchanged", field="cursor") from None


class SagaKeysetPagination(BasePagination):
    """Pages of the saga list by keyset: `next` carries the (last activity, id) of the page's last
    saga and the next page is the index range after it, so page 1,000 costs what page 1 costs and
    no page counts the tenant's sagas (a COUNT, like a deep OFFSET, grows with the tenant).
    `limit` as before (default 50, at most 500); `offset` is refused (400) rather than ignored,
    so a client still paging by offset cannot loop on the first page forever."""

    def paginate_queryset(self, queryset: Any, request: Any, view: Any = None) -> list[Any]:
        params = request.query_params
        if "offset" in params:
            raise DomainError(
                "invalid", "offset: the saga list pages by `cursor` (follow `next`)", field="offset"
            )
        asked = ascii_int(str(params.get("limit", PAGE_SIZE)), max_digits=9)
        limit = PAGE_SIZE if asked is None else min(max(asked, 1), MAX_LIMIT)
        position = _position(params["cursor"]) if params.get("cursor") else None
        rows = selectors.newest_page(
            queryset, tool=params.get("tool", ""), position=position, limit=limit + 1
        )
        self._next = None
        if len(rows) > limit:
            rows = rows[:limit]
            self._next = request.build_absolute_uri("?" + _with(params, cursor=selectors.cursor_of(rows[-1])))
        return rows

    def get_paginated_response(self, data: Any) -> Response:
        return Response({"next": self._next, "results": data})

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "required": ["next", "results"],
            "properties": {
                "next": {"type": "string", "nullable": True, "format": "uri"},
                "results": schema,
            },
        }

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            {"name": "limit", "required": False, "in": "query", "schema": {"type": "integer"}},
            {"name": "cursor", "required": False, "in": "query", "schema": {"type": "string"}},
        ]


def _with(params: Any, **override: str) -> str:
    return urlencode({**{k: params.get(k) for k in params}, **override})


class SagaListView(TenantScopedViewMixin, generics.ListAPIView):
    """Sagas, most recently active first, paged by `cursor` (follow `next`). `status` filters on the
    effective status (a running saga whose lease lapsed is `orphaned`), `tool` on any step's tool,
    `since` on last activity."""

    serializer_class = SagaSerializer
    pagination_class = SagaKeysetPagination
    access = {"GET": READ}

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
        sagas = selectors.all_sagas()
        wanted = params.get("status")
        if wanted:
            if wanted not in SagaStatus.values:
                raise DomainError("invalid", f"status: one of {', '.join(SagaStatus.values)}", field="status")
            sagas = selectors.with_effective_status(sagas, wanted, self._now)
        if params.get("since"):
            sagas = sagas.filter(last_activity_at__gte=_since(params["since"]))
        return sagas  # `tool`, the order and the page: SagaKeysetPagination (selectors.newest_page)


class SagaDetailView(TenantScopedViewMixin, APIView):
    """One saga: its steps (with compensation descriptors, credentials shown as references) and
    its records in log order, each with its leaf index (erased records as redacted stubs)."""

    access = {"GET": READ}

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
        saga = selectors.saga(saga_id)
        if saga is None:
            raise DomainError("not_found", "no such saga", status=404)
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
            for step in selectors.steps_of(saga)
        ]
        out = []
        for stored in audit_selectors.saga_records(saga_id):
            record = stored.record
            body = {
                k: (v if k.startswith("_") or k in ("seq", "ts", "event") else mask_credentials(v, k))
                for k, v in stored.body.items()
            }
            out.append(
                {
                    "stream": record.stream.stream_id,
                    "position": record.position,
                    "leaf_index": record.leaf_index,
                    "redacted": stored.erased,
                    # `record`, plus `record_json` when it holds NaN or Infinity (audit.jsonvalues)
                    **served(body),
                }
            )
        return Response(
            {
                "saga": SagaSerializer(saga, context={"now": timezone.now()}).data,
                "steps": steps,
                "records": out,
            }
        )
