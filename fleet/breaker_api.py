"""Circuit breakers over HTTP (`/api/v1/fleet/breakers`, shapes in docs/ARCHITECTURE.md §8.3):
list and create, one breaker with its history, change and delete; and the tenant's gate settings
(`/api/v1/fleet/settings`: the lease TTL). Reads for the `control` scope or any member, changes for
`control` keys and members whose role may change the fleet."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.schema import ErrorSerializer
from core.errors import DomainError
from fleet import services
from fleet.api import _LIST
from fleet.models import BreakerTransition, CircuitBreaker
from tenants.access import FLEET_CONTROL, FLEET_VIEW
from tenants.permissions import TenantScopedViewMixin

HISTORY_SHOWN = 100


def transition_json(row: BreakerTransition) -> dict[str, Any]:
    return {
        "at": row.at.isoformat(),
        "old_state": row.old_state,
        "new_state": row.new_state,
        "reason": row.reason,
        "actor": row.actor,
    }


def history(breaker: CircuitBreaker, shown: int = HISTORY_SHOWN) -> list[BreakerTransition]:
    """The breaker's transitions, newest first."""
    return list(BreakerTransition.objects.filter(breaker=breaker).order_by("-at", "-pk")[:shown])


def breaker_json(breaker: CircuitBreaker, *, with_history: bool = False) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "id": breaker.pk,
        **services.breaker_values(breaker),
        "state": breaker.state,
        "phase": services.breaker_phase(breaker),
        "opened_at": breaker.opened_at.isoformat() if breaker.opened_at else None,
        "trial": (
            {
                "saga_id": breaker.trial_saga_id,
                "step_id": breaker.trial_step_id,
                "at": breaker.trial_at.isoformat(),
            }
            if breaker.trial_at
            else None
        ),
    }
    if with_history:
        answer["history"] = [transition_json(t) for t in history(breaker)]
    return answer


class BreakerListView(TenantScopedViewMixin, APIView):
    """Circuit breakers: per tool glob, opened fleet-wide by the outcomes agents ship."""

    access = {"GET": FLEET_VIEW, "POST": FLEET_CONTROL}

    @extend_schema(operation_id="fleet_breakers_list", responses={200: _LIST})
    def get(self, request: Request) -> Response:
        return Response([breaker_json(b) for b in CircuitBreaker.objects.order_by("name")])

    @extend_schema(
        operation_id="fleet_breakers_create",
        request=services.BreakerCreate,
        responses={201: serializers.DictField(), 409: ErrorSerializer},
    )
    def post(self, request: Request) -> Response:
        breaker = services.create_breaker(
            self.tenant, services.BreakerCreate.parse(request.data), actor=self.actor
        )
        return Response(breaker_json(breaker, with_history=True), status=201)


class BreakerDetailView(TenantScopedViewMixin, APIView):
    access = {"GET": FLEET_VIEW, "PATCH": FLEET_CONTROL, "DELETE": FLEET_CONTROL}

    @extend_schema(operation_id="fleet_breakers_retrieve", responses={200: serializers.DictField()})
    def get(self, request: Request, breaker_id: int) -> Response:
        breaker = CircuitBreaker.objects.filter(pk=breaker_id).first()
        if breaker is None:
            raise DomainError("not_found", "no such breaker", status=404, field="id")
        return Response(breaker_json(breaker, with_history=True))

    @extend_schema(
        operation_id="fleet_breakers_partial_update",
        request=services.BreakerUpdate,
        responses={200: serializers.DictField(), 409: ErrorSerializer},
    )
    def patch(self, request: Request, breaker_id: int) -> Response:
        change = services.BreakerUpdate.parse(request.data)
        breaker = services.update_breaker(self.tenant, breaker_id, change, actor=self.actor)
        return Response(breaker_json(breaker, with_history=True))

    @extend_schema(operation_id="fleet_breakers_destroy", responses={204: None})
    def delete(self, request: Request, breaker_id: int) -> Response:
        services.delete_breaker(self.tenant, breaker_id, actor=self.actor)
        return Response(status=204)


class FleetSettingsView(TenantScopedViewMixin, APIView):
    """The tenant's gate settings: `lease_ttl_ms` (how long a budget lease lives; null: the
    default) and the one in force."""

    access = {"GET": FLEET_VIEW, "PATCH": FLEET_CONTROL}

    @extend_schema(operation_id="fleet_settings_retrieve", responses={200: serializers.DictField()})
    def get(self, request: Request) -> Response:
        return Response(services.fleet_settings_values(self.tenant))

    @extend_schema(
        operation_id="fleet_settings_partial_update",
        request=services.FleetSettingsUpdate,
        responses={200: serializers.DictField(), 400: ErrorSerializer},
    )
    def patch(self, request: Request) -> Response:
        change = services.FleetSettingsUpdate.parse(request.data)
        return Response(services.set_fleet_settings(self.tenant, change, actor=self.actor))
