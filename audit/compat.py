"""agent-saga compatible endpoints (`SagaCloudClient`, endpoint `<server>/v1`); the reads that
count sagas are `sagas.compat`, the approval queue is `approvals.compat`.

agent-saga's own control plane stores whatever it is sent; here the same payload is verified
exactly like `/api/v1/streams/<id>/records`, attached to streams by chain linkage."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit import services
from audit.api import CHAIN_ERROR, ERROR, RECORDS_BODY, read_json_body, records_from_body
from tenants.access import INGEST
from tenants.permissions import TenantScopedViewMixin


class WalIngestView(TenantScopedViewMixin, APIView):
    """`SagaCloudClient.push_wal_records`: verified, all or nothing."""

    access = {"POST": INGEST}

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
        results = services.ingest_by_linkage(self.tenant, records, actor=self.actor)
        return Response(
            {
                "status": "accepted",
                "records_ingested": sum(r.accepted for r in results),
                "duplicates": sum(r.duplicates for r in results),
                "streams": [r.as_dict() for r in results],
            }
        )
