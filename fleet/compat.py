"""agent-saga's `SagaCloudClient.get_fleet_budget` (`GET <server>/v1/fleet/budget`), answered with
the fleet's real spend from the gate's ledger in the shape agent-saga's own server gives
(`{"status": "ok", "total_spend": <number>, "fleet_nodes": <int>}`), plus what is behind it: each
budget's usage per scope over its window, and the saga counts this route answered before budgets
existed (kept, so clients reading them do not break)."""

from __future__ import annotations

import math
from datetime import timedelta
from decimal import Decimal

from django.db.models import Count
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.models import Record, Stream
from core.errors import DomainError
from fleet import services
from fleet.gate import SCALE, from_units, to_units
from fleet.models import BudgetLimit
from sagas import selectors
from tenants.access import READ
from tenants.permissions import TenantScopedViewMixin

DEFAULT_WINDOW_S = 86400.0
MAX_WINDOW_S = float(services.MAX_WINDOW_S)


def _number(units: int) -> int | float:
    """Units as a JSON number, as agent-saga sums them: an integer when whole (exact), else the
    nearest float of the exact decimal."""
    value = Decimal(units) / SCALE
    return int(value) if value == value.to_integral_value() else float(value)


def _window(raw: str | None) -> float:
    if raw in (None, ""):
        return DEFAULT_WINDOW_S
    try:
        window = float(raw) if len(raw) <= 40 else math.nan
    except ValueError:
        window = math.nan
    if not math.isfinite(window) or not 0 < window <= MAX_WINDOW_S:
        raise DomainError(
            "invalid", f"window: seconds, more than 0 and at most {int(MAX_WINDOW_S)}", field="window"
        )
    return window


class FleetBudgetView(TenantScopedViewMixin, APIView):
    """The fleet's spend over the last `window` seconds (default a day): `total_spend` sums the
    budgeted argument of every call the gate allowed (a call several budgets matched counts once),
    `fleet_nodes` counts the agents it allowed; `budgets` gives each budget's own usage per scope
    over its own window."""

    access = {"GET": READ}

    @extend_schema(
        operation_id="agent_saga_fleet_budget",
        parameters=[OpenApiParameter("window", float, description="seconds (default 86400)")],
        responses={
            200: inline_serializer(
                "AgentSagaFleetBudget",
                {
                    "status": serializers.CharField(),
                    "total_spend": serializers.FloatField(),
                    "fleet_nodes": serializers.IntegerField(),
                    "window": serializers.FloatField(),
                    "budgets": serializers.ListField(child=serializers.DictField()),
                    "sagas": serializers.DictField(child=serializers.IntegerField()),
                    "records": serializers.IntegerField(),
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        window = _window(request.query_params.get("window"))
        spent, agents = services.spend_since(timezone.now() - timedelta(seconds=window))
        budgets = [
            {
                "name": limit.name,
                "tool": limit.tool,
                "argument": limit.argument,
                "cap": from_units(to_units(limit.max_total)),
                "window_s": limit.window_s,
                "usage": services.budget_usage(limit),
            }
            for limit in BudgetLimit.objects.order_by("name")
        ]
        by_status = dict(
            selectors.all_sagas().values_list("status").annotate(n=Count("pk")).values_list("status", "n")
        )
        return Response(
            {
                "status": "ok",
                "total_spend": _number(spent),
                "fleet_nodes": agents,
                "window": window,
                "budgets": budgets,
                "sagas": by_status,
                "records": Record.objects.count(),
                "streams": Stream.objects.count(),
            }
        )
