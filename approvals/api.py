"""Approvals over HTTP (shapes in docs/ARCHITECTURE.md, public contract).

- policies: `GET/POST /api/v1/approvals/policies`, `GET/PATCH/DELETE .../policies/<id>` (scope
  `control`, or members: every member reads, owners and admins change);
- requests: `GET /api/v1/approvals?status=`, `GET /api/v1/approvals/<id>` (with its votes),
  `GET /api/v1/approvals/break-glass` (every break-glass use, for review);
- `POST /api/v1/approvals/<id>/votes` and `POST .../challenge` (people whose role may approve);
- `GET /api/v1/approvals/<id>/wait?timeout=<s>`: answers as soon as the request is decided, else
  after `timeout` (at most 25 s); the SDK loops it until the request's deadline. No transaction
  or database connection is held while waiting.
"""

from __future__ import annotations

import math
import time
from typing import Any

from django.core.cache import cache
from django.http import HttpRequest
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals import selectors, services, wake
from approvals.models import ApprovalPolicy, ApprovalRequest, Status
from controlplane.schema import ErrorSerializer
from core.errors import DomainError
from core.longpoll import abandoned, release_connection
from tenants.access import (
    APPROVAL_POLICIES_CHANGE,
    APPROVAL_POLICIES_VIEW,
    APPROVAL_VOTE,
    APPROVAL_WAIT,
    READ,
)
from tenants.permissions import TenantScopedViewMixin

MAX_WAIT_S = 25.0
_LIST = {"type": "array", "items": {"type": "object", "additionalProperties": True}}


def _policy_json(policy: ApprovalPolicy) -> dict[str, Any]:
    return {"id": policy.pk, **services.policy_values(policy)}


def _request(approval_id: str) -> ApprovalRequest:
    row = selectors.request(approval_id)
    if row is None:
        raise DomainError("not_found", "no such approval request", status=404)
    return row


class PolicyListView(TenantScopedViewMixin, APIView):
    """Approval policies: which calls need whose approval, how many, for how long."""

    access = {"GET": APPROVAL_POLICIES_VIEW, "POST": APPROVAL_POLICIES_CHANGE}

    @extend_schema(operation_id="approval_policies_list", responses={200: _LIST})
    def get(self, request: Request) -> Response:
        return Response([_policy_json(p) for p in selectors.policies()])

    @extend_schema(
        operation_id="approval_policies_create",
        request=services.PolicyCreate,
        responses={201: serializers.DictField(), 409: ErrorSerializer},
    )
    def post(self, request: Request) -> Response:
        terms = services.PolicyCreate.parse(request.data)
        policy = services.create_policy(self.tenant, terms, actor=self.actor)
        return Response(_policy_json(policy), status=201)


class PolicyDetailView(TenantScopedViewMixin, APIView):
    access = {
        "GET": APPROVAL_POLICIES_VIEW,
        "PATCH": APPROVAL_POLICIES_CHANGE,
        "DELETE": APPROVAL_POLICIES_CHANGE,
    }

    @extend_schema(operation_id="approval_policies_retrieve", responses={200: serializers.DictField()})
    def get(self, request: Request, policy_id: int) -> Response:
        policy = selectors.policy(policy_id)
        if policy is None:
            raise DomainError("not_found", "no such approval policy", status=404)
        return Response(_policy_json(policy))

    @extend_schema(
        operation_id="approval_policies_update",
        request=services.PolicyChange,
        responses={200: serializers.DictField(), 409: ErrorSerializer},
    )
    def patch(self, request: Request, policy_id: int) -> Response:
        terms = services.PolicyChange.parse(request.data)
        policy = services.update_policy(self.tenant, policy_id, terms, actor=self.actor)
        return Response(_policy_json(policy))

    @extend_schema(operation_id="approval_policies_destroy", responses={204: None})
    def delete(self, request: Request, policy_id: int) -> Response:
        services.delete_policy(self.tenant, policy_id, actor=self.actor)
        return Response(status=204)


class RequestListView(TenantScopedViewMixin, APIView):
    """Approval requests, newest first; `?status=pending` is the queue."""

    access = {"GET": READ}

    @extend_schema(
        operation_id="approvals_list",
        parameters=[OpenApiParameter("status", str, enum=list(Status.values))],
        responses={200: _LIST},
    )
    def get(self, request: Request) -> Response:
        status = request.query_params.get("status") or None
        if status is not None and status not in Status.values:
            raise DomainError("invalid", f"status: one of {', '.join(Status.values)}", field="status")
        return Response([services.request_values(r) for r in selectors.requests(status)])


class BreakGlassListView(TenantScopedViewMixin, APIView):
    """Every break-glass approval (who, why, what), newest first, for review."""

    access = {"GET": READ}

    @extend_schema(operation_id="approvals_break_glass", responses={200: _LIST})
    def get(self, request: Request) -> Response:
        return Response(selectors.break_glass_uses())


class RequestDetailView(TenantScopedViewMixin, APIView):
    """One request: the exact action, the policy's terms, the votes so far, the time left."""

    access = {"GET": READ}

    @extend_schema(operation_id="approvals_retrieve", responses={200: serializers.DictField()})
    def get(self, request: Request, approval_id: str) -> Response:
        row = _request(approval_id)
        votes = [services.vote_values(v) for v in selectors.votes(row)]
        return Response({**services.request_values(row), "rules": row.rules, "votes": votes})


class VoteView(TenantScopedViewMixin, APIView):
    """A member's vote: `{"choice": "approve" | "deny", "note": ..., "break_glass": false}`.
    Passkey-only policies take votes through the passkey flow (a verified assertion)."""

    access = {"POST": APPROVAL_VOTE}

    @extend_schema(
        operation_id="approvals_vote",
        request=services.ApprovalVote,
        responses={201: serializers.DictField(), 409: ErrorSerializer},
    )
    def post(self, request: Request, approval_id: str) -> Response:
        # The body and break_glass, then the request's 404 (and the voter still a member), then
        # choice and note: the order the refusals had when the service judged the body.
        services.VoteGlass.parse(request.data)
        assert self.membership is not None  # APPROVAL_VOTE is closed to keys
        services.check_votable(self.tenant, approval_id[:64], self.membership)
        terms = services.ApprovalVote.parse(request.data)
        row = services.vote(
            self.tenant,
            approval_id[:64],
            self.membership,
            terms.choice,
            terms.note,
            actor=self.actor,
            break_glass=terms.break_glass,
        )
        return Response(services.request_values(row), status=201)


class ChallengeView(TenantScopedViewMixin, APIView):
    """A single-use passkey challenge for this member's vote: SHA-256(action digest ‖ nonce).
    `{"break_glass": true}` asks for a break-glass vote's; any other body is an ordinary one
    (`VoteChallengeAsk` reads it leniently, as the view did by hand)."""

    access = {"POST": APPROVAL_VOTE}

    @extend_schema(
        operation_id="approvals_challenge",
        request=services.VoteChallengeAsk,
        responses={201: serializers.DictField(), 409: ErrorSerializer},
    )
    def post(self, request: Request, approval_id: str) -> Response:
        terms = services.VoteChallengeAsk.parse(request.data)
        assert self.membership is not None
        issued = services.issue_vote_challenge(
            self.tenant, approval_id[:64], self.membership, actor=self.actor, break_glass=terms.break_glass
        )
        return Response(issued, status=201)


def _wait_values(row: ApprovalRequest) -> dict[str, Any]:
    values = services.request_values(row)
    status = row.status
    if status == Status.PENDING and values["expires_in"] == 0:
        status = Status.EXPIRED  # past its deadline: the sweep records it, the answer is already no
    return {
        "id": row.pk,
        "status": status,
        "approvals": row.approvals,
        "required": row.required,
        "expires_at": values["expires_at"],
        "expires_in": values["expires_in"],
        "execute_by": values["execute_by"],
        "decided_by": row.decided_by,
        "note": row.note,
    }


class WaitView(TenantScopedViewMixin, APIView):
    """Long-poll one request: answers at once when it is decided, else within a second of the
    deciding vote, else after `timeout` seconds (at most 25) with it still pending."""

    access = {"GET": APPROVAL_WAIT}

    @extend_schema(
        operation_id="approvals_wait",
        parameters=[OpenApiParameter("timeout", float, description="seconds, at most 25")],
        responses={200: serializers.DictField()},
    )
    def get(self, request: Request, approval_id: str) -> Response:
        # The wake counter is read before the state: a decision committing between the two reads
        # moves it past what the wait compares against.
        key = wake.wake_key(self.tenant.pk, approval_id[:64])
        self._heard = wake.heard(key)
        self._seen = cache.get(key)
        return Response(_wait_values(_request(approval_id)))

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            raw = request.GET.get("timeout", "0") or "0"
            timeout = float(raw) if len(raw) <= 40 else math.nan
        except ValueError:
            timeout = math.nan
        if not math.isfinite(timeout) or timeout < 0:
            return self._refuse(request, "timeout: seconds from 0 (at most 25 are waited)")
        deadline = time.monotonic() + min(timeout, MAX_WAIT_S)
        while True:
            response = super().dispatch(request, *args, **kwargs)
            data = getattr(response, "data", None)
            pending = isinstance(data, dict) and data.get("status") == Status.PENDING
            if response.status_code != 200 or not pending or time.monotonic() >= deadline or abandoned():
                return response
            expires_in = data.get("expires_in") if isinstance(data, dict) else None
            until = (
                deadline if expires_in is None else min(deadline, time.monotonic() + float(expires_in) + 0.05)
            )
            release_connection()
            self._wait_for_change(getattr(self, "tenant", None), kwargs.get("approval_id", ""), until)

    def _refuse(self, request: HttpRequest, detail: str) -> Any:
        self.headers = {}
        drf_request = self.initialize_request(request)
        self.request = drf_request
        response = self.handle_exception(DomainError("invalid", detail, field="timeout"))
        return self.finalize_response(drf_request, response)

    def _wait_for_change(self, tenant: Any, approval_id: str, until: float) -> None:
        """Until the request's wake-up is heard, a second passes (the database is read again:
        embedded mode's cache is per process, and a wake-up may be lost) or `until`."""
        if tenant is None:
            return
        key = wake.wake_key(tenant.pk, approval_id[:64])
        wake.wait(
            key, getattr(self, "_seen", None), getattr(self, "_heard", 0), min(until, time.monotonic() + 1.0)
        )
