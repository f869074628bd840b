"""The gate and the fleet's policies over HTTP (shapes in docs/ARCHITECTURE.md, public contract).

- `POST /api/v1/gate/evaluate` (key scope `gate`): the pre-flight answer for one call.
- `GET /api/v1/fleet/status` (scope `gate`, or any member): halts in force and the governed tool
  globs, with a `version`; `?since=<version>&wait=<s>` long-polls until it changes.
- budgets, rate limits, halts (scope `control`, or members whose role may act) and quarantine;
  circuit breakers in `fleet.breaker_api`.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
from collections.abc import Mapping
from typing import Any

from django.core.cache import cache
from django.http import HttpRequest
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.schema import ErrorSerializer
from core import availability
from core.actors import Actor
from core.errors import DomainError
from core.inputs import json_object
from core.longpoll import abandoned, pause, release_connection
from fleet import selectors, services
from fleet.calls import gate_call
from fleet.models import BudgetLimit, Halt, RateLimit
from tenants.access import FLEET_CONTROL, FLEET_HALT, FLEET_VIEW, GATE, GATE_STATUS
from tenants.permissions import TenantScopedViewMixin

MAX_WAIT_S = 25.0
# The status names at most this many quarantined sagas (an SDK holding budget leases decides no
# call of a saga named there in process; past it, `quarantined_truncated`: none at all).
QUARANTINED_SHOWN = 1000


# A list of objects (spectacular renders a bare ListField response as an object).
_LIST = {"type": "array", "items": {"type": "object", "additionalProperties": True}}


# ----------------------------------------------------------------------------------------- the gate

_ANSWER = inline_serializer(
    "GateAnswer",
    {
        "decision": serializers.ChoiceField(choices=["allow", "deny", "pending_approval"]),
        "authorization_id": serializers.UUIDField(required=False),
        # A refusal's own id: the SDK keeps the answer in its GATE_DENY, so the denials list
        # shows a refusal the agent records once (fleet.actions.agent_denials).
        "decision_id": serializers.UUIDField(required=False),
        "reason": serializers.CharField(required=False),
        "limit": serializers.CharField(required=False),
        "remaining": serializers.CharField(required=False),
        "retry_after": serializers.IntegerField(required=False, allow_null=True),
        "reservation": serializers.DictField(required=False),
    },
)


class GateEvaluateView(TenantScopedViewMixin, APIView):
    """Ask before an effect: kill switch, quarantine, budgets and rate limits (one atomic
    check-and-debit across every matching limit), then approval policy. A refusal debits nothing;
    an allow is permanent; the same saga, step, tool and arguments get the same allow back."""

    access = {"POST": GATE}

    @extend_schema(
        operation_id="gate_evaluate",
        request=inline_serializer(
            "GateCall",
            {
                "saga_id": serializers.CharField(),
                "step_id": serializers.CharField(),
                "tool": serializers.CharField(),
                "semantics": serializers.CharField(required=False),
                "args": serializers.DictField(required=False),
                "agent": serializers.CharField(required=False),
                "tags": serializers.ListField(child=serializers.CharField(), required=False),
                "idempotency_key": serializers.CharField(required=False),
                "reason": serializers.CharField(required=False, max_length=500),
                "reserve": serializers.CharField(required=False),
            },
        ),
        responses={200: _ANSWER},
    )
    def post(self, request: Request) -> Response:
        call = gate_call(json_object(request.data), self.api_key.prefix if self.api_key else "")
        return Response(services.evaluate(self.tenant, call, actor=self.actor))

    # Fail closed, fast (core/availability.py): while a store is known to be down the call
    # is refused before authentication reads anything; a call's wait for a pooled connection is
    # bounded; an outage met on the way (authentication included) is the same 503 refusal.

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        with availability.connection_wait():
            return super().dispatch(request, *args, **kwargs)

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        availability.guard()
        super().initial(request, *args, **kwargs)

    def handle_exception(self, exc: Exception) -> Response:
        refused = availability.failed(exc) if not isinstance(exc, availability.Unavailable) else exc
        response = super().handle_exception(refused or exc)
        if refused is not None:
            response["Retry-After"] = "1"
        return response


# ------------------------------------------------------------------------------------------ leases

_LEASE_ANSWER = inline_serializer(
    "GateLeaseAnswer",
    {
        "decision": serializers.ChoiceField(choices=["lease", "per_call"]),
        "reason": serializers.CharField(required=False),
        "lease_id": serializers.UUIDField(required=False),
        "ttl_ms": serializers.IntegerField(required=False),
        "limits": serializers.ListField(child=serializers.DictField(), required=False),
        "scope_args": serializers.ListField(child=serializers.CharField(), required=False),
        "returned": serializers.DictField(required=False),
    },
)


def _uuid(value: Any, name: str) -> uuid.UUID:
    try:
        if isinstance(value, str) and len(value) <= 40:
            return uuid.UUID(value)
    except ValueError:
        pass
    raise DomainError("invalid", f"{name}: a UUID", field=name)


def _returned(tenant: Any, data: Any, actor: Actor, name: str) -> dict[str, Any]:
    """Give one lease back (`{"lease_id", "used": {limit: amount}}`), as its route or a renewal."""
    if not isinstance(data, dict):
        raise DomainError("invalid", f"{name}: a JSON object", field=name)
    used = data.get("used", {})
    if not isinstance(used, dict):
        raise DomainError("invalid", f"{name}.used: an object of amounts by limit", field=f"{name}.used")
    return _give_back(tenant, _uuid(data.get("lease_id"), f"{name}.lease_id"), used, actor, name)


def _give_back(
    tenant: Any, lease_id: uuid.UUID, used: Mapping[str, Any], actor: Actor, name: str
) -> dict[str, Any]:
    """The lease given back, its use judged with it (`{name}.used` at fault), or 404."""
    try:
        answer = services.give_back_lease(tenant, lease_id, used, actor=actor)
    except ValueError as exc:
        raise DomainError("invalid", f"{name}.{exc}", field=f"{name}.used") from None
    if answer is None:
        raise DomainError("not_found", "no such lease", status=404)
    return answer


class GateLeaseView(TenantScopedViewMixin, APIView):
    """Lease budget units for up to `calls` calls like this one (its tool, agent and the arguments
    that scope its budgets), decided by the agent in process until `ttl_ms` passes; or `per_call`
    with the reason (ask `gate/evaluate` per call). `returns` gives an earlier lease back in the same
    round trip (a renewal). A lease never refuses: a refusal is the per-call gate's."""

    access = {"POST": GATE}

    @extend_schema(
        operation_id="gate_lease",
        request=inline_serializer(
            "GateLeaseCall",
            {
                "lease_id": serializers.UUIDField(),
                "calls": serializers.IntegerField(),
                "saga_id": serializers.CharField(),
                "tool": serializers.CharField(),
                "args": serializers.DictField(required=False),
                "agent": serializers.CharField(required=False),
                "tags": serializers.ListField(child=serializers.CharField(), required=False),
                "returns": serializers.DictField(required=False),
            },
        ),
        responses={200: _LEASE_ANSWER},
    )
    def post(self, request: Request) -> Response:
        data = json_object(request.data)
        lease_id = _uuid(data.get("lease_id"), "lease_id")
        calls = data.get("calls")
        if (
            isinstance(calls, bool)
            or not isinstance(calls, int)
            or not 1 <= calls <= services.LEASE_MAX_CALLS
        ):
            raise DomainError("invalid", f"calls: 1 to {services.LEASE_MAX_CALLS}", field="calls")
        call = gate_call({**data, "step_id": "lease"}, self.api_key.prefix if self.api_key else "")
        returned = (
            _returned(self.tenant, data["returns"], self.actor, "returns") if "returns" in data else None
        )
        answer = services.grant_lease(self.tenant, call, calls=calls, lease_id=lease_id, actor=self.actor)
        if returned is not None:
            answer["returned"] = returned
        return Response(answer)


class GateLeaseReturnView(TenantScopedViewMixin, APIView):
    """Give a lease back: `{"used": {limit: amount}}` is recorded (at most what was granted), the
    rest returns to the budgets. Once per lease: a retry answers the first."""

    access = {"POST": GATE}

    @extend_schema(
        operation_id="gate_lease_return",
        request=services.GateLeaseReturn,
        responses={200: _LEASE_ANSWER, 404: ErrorSerializer},
    )
    def post(self, request: Request, lease_id: uuid.UUID) -> Response:
        # The body's shape is judged first; its limits and amounts with the lease, once found.
        use = services.GateLeaseReturn.parse(request.data)
        return Response(_give_back(self.tenant, lease_id, use.used, self.actor, "body"))


# ------------------------------------------------------------------------------------ reservations

_SETTLEMENT = inline_serializer(
    "GateReservation",
    {
        "id": serializers.UUIDField(),
        "state": serializers.ChoiceField(choices=["open", "settled"]),
        "reserved": serializers.CharField(),
        "actual": serializers.CharField(required=False),
        "overrun": serializers.CharField(required=False),
        "settled_by": serializers.CharField(required=False),
    },
)


class GateReservationSettleView(TenantScopedViewMixin, APIView):
    """Settle a reservation (an allow asked with `reserve`) at `{"actual": amount}`: the difference
    returns to its budgets, an actual above the reserve is an overrun, counted. Once: a settled
    reservation answers its settlement again (agents usually settle in their WAL's step records)."""

    access = {"POST": GATE}

    @extend_schema(
        operation_id="gate_reservation_settle",
        request=services.GateSettle,
        responses={200: _SETTLEMENT, 404: ErrorSerializer},
    )
    def post(self, request: Request, reservation_id: uuid.UUID) -> Response:
        # The amount is judged before the reservation is looked up (a bad one is 400, found or not).
        settlement = services.GateSettle.parse(request.data)
        answer = services.settle_reservation(self.tenant, reservation_id, settlement, actor=self.actor)
        if answer is None:
            raise DomainError("not_found", "no such reservation", status=404)
        return Response(answer)


# ------------------------------------------------------------------------------------ fleet status


def _status() -> dict[str, Any]:
    halts = [_halt_json(h) for h in services.halts_in_force()]
    quarantined = sorted(selectors.quarantined_saga_ids().order_by("saga_id")[: QUARANTINED_SHOWN + 1])
    state = {
        "halts": halts,
        "governed_tools": services.governed_tools(),
        "breakers": services.status_entries(),
        "quarantined": quarantined[:QUARANTINED_SHOWN],
        "quarantined_truncated": len(quarantined) > QUARANTINED_SHOWN,
    }
    digest = hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {**state, "version": digest}


class FleetStatusView(TenantScopedViewMixin, APIView):
    """What an agent must know to act safely: halts in force, which tools a limit governs and the
    circuit breakers that are not closed (`open`: refuse; `half_open`: ask the gate).
    `since=<version>&wait=<seconds>` answers as soon as the state differs from `since` (or a halt
    lapses), else after `wait` (at most 25 s) — the SDK keeps one such call open, so a halt
    reaches a running agent within about a second. No transaction or connection is held while
    waiting."""

    access = {"GET": GATE_STATUS}

    @extend_schema(
        operation_id="fleet_status",
        parameters=[OpenApiParameter("since", str), OpenApiParameter("wait", float)],
        responses={
            200: inline_serializer(
                "FleetStatus",
                {
                    "halts": serializers.ListField(child=serializers.DictField()),
                    "governed_tools": serializers.ListField(child=serializers.CharField()),
                    "breakers": serializers.ListField(child=serializers.DictField()),
                    "version": serializers.CharField(),
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        # The change counter is read before the state: a change that commits between the two
        # reads then moves the counter past what the wait below compares against, and wakes it.
        # (Read after the state, such a change went unseen until the once-a-second re-read.)
        self._seen_version = cache.get(services.version_key(self.tenant.pk))
        return Response(_status())

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        since = request.GET.get("since", "")
        try:
            wait = float(request.GET.get("wait", "0") or 0)
        except ValueError:
            wait = math.nan
        if not math.isfinite(wait) or wait < 0:
            return self._refuse(request, "wait: seconds from 0 (at most 25 are waited)")
        wait = min(wait, MAX_WAIT_S)
        deadline = time.monotonic() + wait
        while True:
            response = super().dispatch(request, *args, **kwargs)
            data = getattr(response, "data", None)
            changed = not isinstance(data, dict) or data.get("version") != since
            if response.status_code != 200 or changed or time.monotonic() >= deadline or abandoned():
                return response
            release_connection()
            self._wait_for_change(
                getattr(self, "tenant", None), getattr(self, "_seen_version", None), deadline
            )

    def _refuse(self, request: HttpRequest, detail: str) -> Any:
        self.headers = {}
        drf_request = self.initialize_request(request)
        self.request = drf_request
        response = self.handle_exception(DomainError("invalid", detail, field="wait"))
        return self.finalize_response(drf_request, response)

    @staticmethod
    def _wait_for_change(tenant: Any, seen: Any, deadline: float) -> None:
        """Until the tenant's change counter moves from `seen` (read before the state), a second
        passes (a halt may lapse, and in embedded mode the cache is per process) or the deadline:
        then the state is read again."""
        key = services.version_key(tenant.pk) if tenant is not None else ""
        until = min(deadline, time.monotonic() + 1.0)
        while time.monotonic() < until:
            if pause(0.05) or (key and cache.get(key) != seen):
                return


# --------------------------------------------------------------------------------------- policies


def _budget_json(limit: BudgetLimit) -> dict[str, Any]:
    return {"id": limit.pk, **services.budget_values(limit), "usage": services.budget_usage(limit)}


def _rate_json(limit: RateLimit) -> dict[str, Any]:
    return {"id": limit.pk, **services.rate_limit_values(limit)}


def _halt_json(halt: Halt) -> dict[str, Any]:
    return {
        "id": halt.pk,
        **services.halt_values(halt),
        "actor": halt.actor,
        "created_at": halt.created_at.isoformat(),
    }


class BudgetListView(TenantScopedViewMixin, APIView):
    """Budgets: at most `max_total` of the argument over any `window_s`, per scope."""

    access = {"GET": FLEET_VIEW, "POST": FLEET_CONTROL}

    @extend_schema(operation_id="fleet_budgets_list", responses={200: _LIST})
    def get(self, request: Request) -> Response:
        return Response([_budget_json(b) for b in BudgetLimit.objects.order_by("name")])

    @extend_schema(
        operation_id="fleet_budgets_create",
        request=services.BudgetCreate,
        responses={201: serializers.DictField(), 409: ErrorSerializer},
    )
    def post(self, request: Request) -> Response:
        budget = services.BudgetCreate.parse(request.data)
        limit = services.create_budget(self.tenant, budget, actor=self.actor)
        return Response(_budget_json(limit), status=201)


class BudgetDetailView(TenantScopedViewMixin, APIView):
    access = {"GET": FLEET_VIEW, "PATCH": FLEET_CONTROL, "DELETE": FLEET_CONTROL}

    @extend_schema(operation_id="fleet_budgets_retrieve", responses={200: serializers.DictField()})
    def get(self, request: Request, budget_id: int) -> Response:
        limit = BudgetLimit.objects.filter(pk=budget_id).first()
        if limit is None:
            raise DomainError("not_found", "no such budget", status=404)
        return Response(_budget_json(limit))

    @extend_schema(
        operation_id="fleet_budgets_partial_update",
        request=services.BudgetCreate,
        responses={200: serializers.DictField(), 400: ErrorSerializer, 404: ErrorSerializer},
    )
    def patch(self, request: Request, budget_id: int) -> Response:
        """Change some of a budget's terms (its name stays), as the Fleet page's Edit does."""
        limit = BudgetLimit.objects.select_for_update().filter(pk=budget_id).first()
        if limit is None:
            raise DomainError("not_found", "no such budget", status=404, field="id")
        current = services.budget_values(limit)
        budget = services.BudgetCreate.parse_change(current, request.data, fixed=("name",))
        return Response(_budget_json(services.update_budget(self.tenant, limit.pk, budget, actor=self.actor)))

    @extend_schema(operation_id="fleet_budgets_destroy", responses={204: None})
    def delete(self, request: Request, budget_id: int) -> Response:
        services.delete_budget(self.tenant, budget_id, actor=self.actor)
        return Response(status=204)


class RateLimitListView(TenantScopedViewMixin, APIView):
    """Rate limits: at most `max_calls` over `window_s` (GCRA), per scope."""

    access = {"GET": FLEET_VIEW, "POST": FLEET_CONTROL}

    @extend_schema(operation_id="fleet_rate_limits_list", responses={200: _LIST})
    def get(self, request: Request) -> Response:
        return Response([_rate_json(r) for r in RateLimit.objects.order_by("name")])

    @extend_schema(
        operation_id="fleet_rate_limits_create",
        request=services.RateLimitCreate,
        responses={201: serializers.DictField(), 409: ErrorSerializer},
    )
    def post(self, request: Request) -> Response:
        rate_limit = services.RateLimitCreate.parse(request.data)
        limit = services.create_rate_limit(self.tenant, rate_limit, actor=self.actor)
        return Response(_rate_json(limit), status=201)


class RateLimitDetailView(TenantScopedViewMixin, APIView):
    access = {"PATCH": FLEET_CONTROL, "DELETE": FLEET_CONTROL}

    @extend_schema(
        operation_id="fleet_rate_limits_partial_update",
        request=services.RateLimitCreate,
        responses={200: serializers.DictField(), 400: ErrorSerializer, 404: ErrorSerializer},
    )
    def patch(self, request: Request, rate_limit_id: int) -> Response:
        """Change some of a rate limit's terms (its name stays), as the Fleet page's Edit does."""
        limit = RateLimit.objects.select_for_update().filter(pk=rate_limit_id).first()
        if limit is None:
            raise DomainError("not_found", "no such rate limit", status=404, field="id")
        current = services.rate_limit_values(limit)
        rate_limit = services.RateLimitCreate.parse_change(current, request.data, fixed=("name",))
        changed = services.update_rate_limit(self.tenant, limit.pk, rate_limit, actor=self.actor)
        return Response(_rate_json(changed))

    @extend_schema(operation_id="fleet_rate_limits_destroy", responses={204: None})
    def delete(self, request: Request, rate_limit_id: int) -> Response:
        services.delete_rate_limit(self.tenant, rate_limit_id, actor=self.actor)
        return Response(status=204)


class HaltListView(TenantScopedViewMixin, APIView):
    """Kill switches in force; POST engages one (reason required, optional TTL)."""

    access = {"GET": FLEET_VIEW, "POST": FLEET_HALT}

    @extend_schema(operation_id="fleet_halts_list", responses={200: _LIST})
    def get(self, request: Request) -> Response:
        return Response([_halt_json(h) for h in services.halts_in_force()])

    @extend_schema(
        operation_id="fleet_halts_create",
        request=services.HaltCreate,
        responses={201: serializers.DictField()},
    )
    def post(self, request: Request) -> Response:
        halt = services.halt(self.tenant, services.HaltCreate.parse(request.data), actor=self.actor)
        return Response(_halt_json(halt), status=201)


class HaltDetailView(TenantScopedViewMixin, APIView):
    access = {"DELETE": FLEET_HALT}

    @extend_schema(operation_id="fleet_halts_destroy", responses={204: None})
    def delete(self, request: Request, halt_id: int) -> Response:
        services.resume(self.tenant, halt_id, actor=self.actor)
        return Response(status=204)


class QuarantineView(TenantScopedViewMixin, APIView):
    """Set one saga aside: the gate refuses its steps; recovery skips it."""

    access = {"POST": FLEET_HALT}

    @extend_schema(
        operation_id="sagas_quarantine",
        request=services.QuarantineCreate,
        responses={201: serializers.DictField()},
    )
    def post(self, request: Request, saga_id: str) -> Response:
        """A saga no record has named yet is 404 `saga_not_found`, unless `preemptive: true`."""
        # 404 before the body is judged, unless the body asks for preemptive (or names a wrong
        # flag, refused as such by the input).
        asked = services.QuarantineAsked.parse(request.data)
        services.refuse_unknown_saga(saga_id, preemptive=asked.preemptive)
        terms = services.QuarantineCreate.parse(request.data)
        row = services.quarantine(self.tenant, saga_id, terms, actor=self.actor)
        return Response(
            {"saga_id": row.saga_id, "reason": row.reason, "actor": row.actor, "preemptive": row.preemptive},
            status=201,
        )
