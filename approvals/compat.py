"""agent-saga compatibility: its approval requests join the queue, and its client pulls decisions.

- An `APPROVAL_REQUESTED` record in a WAL an agent-saga agent ships (`POST /v1/wal/ingest`) opens
  a request bound to agent-saga's own request id (`external_id`) and to its action, requested by
  the shipping key's creator (approvals/actions/external.py), once the ingest has committed
  (`audit.hooks.after_records_committed`; a failure here never refuses evidence). agent-saga does
  not put the saga id in that record: it is the saga the stream last started before it.
- `GET /v1/approvals?status=` (`SagaCloudClient.pull_approvals`) lists requests in agent-saga's
  shape: `id` (agent-saga's id where it has one), `status` PENDING / GRANTED / DENIED / EXPIRED,
  `approver`, `note`; `pull_approvals(status="granted", apply_to=store)` then releases the agent
  waiting on its local store.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from sagaplane.events import Event

from approvals import services
from approvals.actions import external
from approvals.models import ApprovalRequest, Status
from audit.hooks import AppendedRecords
from audit.models import SERVER_STREAM_ID, Record
from core.actors import api_key_prefix_of, shown_name
from core.errors import DomainError
from core.scoping import tenant_context
from tenants.access import READ
from tenants.actors import agent_saga_actor
from tenants.permissions import TenantScopedViewMixin

log = logging.getLogger(__name__)

AS_STATUS: dict[str, str] = {
    Status.PENDING.value: "PENDING",
    Status.APPROVED.value: "GRANTED",
    Status.CONSUMED.value: "GRANTED",
    Status.DENIED.value: "DENIED",
    Status.EXPIRED.value: "EXPIRED",
    Status.LAPSED.value: "EXPIRED",
}
WANTED: dict[str, list[str]] = {
    "pending": ["pending"],
    "granted": ["approved", "consumed"],
    "denied": ["denied"],
    "expired": ["expired", "lapsed"],
    "decided": ["approved", "consumed", "denied", "expired", "lapsed"],
    "all": list(Status.values),
}


def _saga_of(stream: Any, position: int) -> str:
    started = (
        Record.objects.filter(stream=stream, event=Event.SAGA_START, position__lt=position)
        .exclude(saga_id="")
        .order_by("-position")
        .values_list("saga_id", flat=True)
        .first()
    )
    return started or ""


def _deadline(value: Any) -> datetime:
    now = timezone.now()
    try:
        moment = datetime.fromtimestamp(float(value), tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        moment = now + timedelta(seconds=services.BUDGET_RULES["ttl_s"])
    return min(max(moment, now + timedelta(seconds=1)), now + timedelta(seconds=services.MAX_TTL_S))


def requests_from_wal(appended: AppendedRecords) -> None:
    """After an ingest commits: open a request for each agent-saga APPROVAL_REQUESTED record."""
    if appended.stream_id == SERVER_STREAM_ID:
        return
    wanted = [
        (row, fields)
        for row, fields in appended.items
        if row.event == Event.APPROVAL_REQUESTED and isinstance(fields.get("request_id"), str)
    ]
    # The key that shipped them: its creator is the requester (approvals/actions/external.py).
    shipper = api_key_prefix_of(appended.actor)
    for row, fields in wanted:
        external_id = fields["request_id"][:128]
        raw = fields.get("context")
        context: dict[str, Any] = raw if isinstance(raw, dict) else {}
        tool = str(fields.get("tool") or "unknown")[:200]
        rule = str(fields.get("rule") or "")[:80]
        try:  # each request its own transaction: one refused does not stop the others
            with tenant_context(appended.tenant):
                external.open_external(
                    appended.tenant,
                    external_id=external_id,
                    saga_id=str(row.saga_id) if row.saga_id else _saga_of(row.stream, row.position),
                    step_id=str(fields.get("step_id") or "")[:128],
                    tool=tool,
                    args=context,
                    rule=rule,
                    reason=str(fields.get("reason") or "")[:500],
                    expires_at=_deadline(fields.get("expires_at")),
                    api_key_prefix=shipper,
                    actor=agent_saga_actor(appended.stream_id),
                )
        except Exception:
            log.warning("agent-saga approval %s could not join the queue", external_id, exc_info=True)


def as_agent_saga(row: ApprovalRequest) -> dict[str, Any]:
    approver = shown_name(row.decided_by) if row.decided_by not in ("deadline", "") else ""
    return {
        "id": row.external_id or row.pk,
        "status": AS_STATUS.get(row.status, "PENDING"),
        "approver": approver,
        "note": row.note,
        "break_glass": row.break_glass,
        "saga_id": row.saga_id,
        "step_id": row.step_id,
        "tool": row.tool,
        "context": row.args,
        "requested_at": row.created_at.timestamp(),
        "expires_at": row.expires_at.timestamp(),
        "decided_at": row.decided_at.timestamp() if row.decided_at else 0.0,
    }


class ApprovalsView(TenantScopedViewMixin, APIView):
    """`SagaCloudClient.pull_approvals`: the approval queue in agent-saga's shape. `status`:
    pending (the default), granted, denied, expired, decided or all (either case)."""

    access = {"GET": READ}

    @extend_schema(
        operation_id="agent_saga_approvals",
        parameters=[
            OpenApiParameter("status", str, description="pending, granted, denied, expired, decided, all")
        ],
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
        wanted = (request.query_params.get("status") or "pending").lower()
        if wanted not in WANTED:
            raise DomainError("invalid", f"status: one of {', '.join(WANTED)}", field="status")
        rows = ApprovalRequest.objects.filter(status__in=WANTED[wanted]).order_by("-created_at", "pk")[:500]
        return Response({"status": wanted, "approvals": [as_agent_saga(r) for r in rows]})
