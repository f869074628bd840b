"""The tenant's witnesses (ARCHITECTURE §6, "Witnesses"): who cosigns its checkpoints, the quorum,
what each cosigned last and what they refused; changes by owners and admins only (people, never
a key: who vouches for the log is a person's decision), each audited with old and new values."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.schema import ErrorSerializer
from tenants.access import READ, WITNESSES_CHANGE
from tenants.permissions import TenantScopedViewMixin
from transparency import witnesses
from transparency.models import Cosignature, Witness, WitnessRefusal

REFUSALS_SHOWN = 50


def witness_json(w: Witness) -> dict[str, Any]:
    return {
        "id": w.pk,
        "name": w.name,
        "url": w.url,
        "vkey": w.vkey,
        "cosigned_size": w.cosigned_size,
        "cosigned_at": w.cosigned_at,
        "last_status": w.last_status,
        "last_error": w.last_error,
        "failures": w.failures,
        "next_attempt_at": w.next_attempt_at if w.failures else None,
    }


def refusal_json(r: WitnessRefusal) -> dict[str, Any]:
    return {
        "witness": r.witness_name,
        "size": r.size,
        "status": r.status,
        "detail": r.detail,
        "at": r.created_at,
        "split_view": r.status == 422,
    }


class WitnessListView(TenantScopedViewMixin, APIView):
    """GET: the quorum, the witnesses and their state, the latest refusals. POST: add a witness
    `{"name", "url", "vkey"}` (its URL passes the outbound-address guard)."""

    access = {"GET": READ, "POST": WITNESSES_CHANGE}

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        refusals = WitnessRefusal.objects.order_by("-id")[:REFUSALS_SHOWN]
        return Response(
            {
                "quorum": witnesses.quorum(),
                "witnesses": [witness_json(w) for w in witnesses.witnesses()],
                "refusals": [refusal_json(r) for r in refusals],
            }
        )

    @extend_schema(request=witnesses.WitnessAdd, responses={201: OpenApiTypes.OBJECT, 409: ErrorSerializer})
    def post(self, request: Request) -> Response:
        body = request.data if isinstance(request.data, dict) else {}  # anything else: every field missing
        witness = witnesses.add_witness(self.tenant, witnesses.WitnessAdd.parse(body), actor=self.actor)
        return Response(witness_json(witness), status=status.HTTP_201_CREATED)


class WitnessDetailView(TenantScopedViewMixin, APIView):
    """DELETE: stop asking this witness (its cosignatures stay; the quorum is lowered if above)."""

    access = {"DELETE": WITNESSES_CHANGE}

    @extend_schema(responses={204: None})
    def delete(self, request: Request, witness_id: int) -> Response:
        witnesses.remove_witness(self.tenant, witness_id, actor=self.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)


class WitnessQuorumView(TenantScopedViewMixin, APIView):
    """PUT `{"quorum": k}`: how many witnesses must cosign (0: none)."""

    access = {"PUT": WITNESSES_CHANGE}

    @extend_schema(request=witnesses.QuorumSet, responses=OpenApiTypes.OBJECT)
    def put(self, request: Request) -> Response:
        body = request.data if isinstance(request.data, dict) else {}  # anything else: quorum missing
        terms = witnesses.QuorumSet.parse(body)
        return Response({"quorum": witnesses.set_quorum(self.tenant, terms, actor=self.actor)})


class WitnessCheckpointsView(TenantScopedViewMixin, APIView):
    """The newest checkpoint each witness cosigned: its size, when, and the checkpoint note with
    the log's signature and that witness's cosignature (C2SP signed note)."""

    access = {"GET": READ}

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        now, out = timezone.now(), []
        for w in witnesses.witnesses():
            cosig = (
                Cosignature.objects.filter(witness=w)
                .select_related("checkpoint")
                .order_by("-checkpoint_id")
                .first()
            )
            out.append(
                {
                    "witness": w.name,
                    "size": cosig.checkpoint.size if cosig else None,
                    "cosigned_at": cosig.created_at if cosig else None,
                    "timestamp": cosig.timestamp if cosig else None,
                    "age_seconds": (now - cosig.created_at).total_seconds() if cosig else None,
                    "checkpoint": cosig.checkpoint.note + cosig.line if cosig else None,
                }
            )
        return Response({"witnesses": out})


class WitnessPolicyView(TenantScopedViewMixin, APIView):
    """The tenant's C2SP tlog-policy file (log keys, witnesses, quorum), text/plain: what
    `sagaplane verify-* --policy FILE` takes. Check its keys against the tenant's own channel."""

    access = {"GET": READ}

    @extend_schema(responses={(200, "text/plain"): OpenApiTypes.STR})
    def get(self, request: Request) -> HttpResponse:
        response = HttpResponse(witnesses.policy_text(self.tenant), content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = 'inline; filename="sagaplane.policy"'
        return response
