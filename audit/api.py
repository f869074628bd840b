"""Agent-facing ingest and stream endpoints, and erasure. Views parse and answer; every change
goes through `audit.services`."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit import services
from audit.models import Record, Redaction, Stream
from core import timing
from core.errors import DomainError
from core.numbers import ascii_int
from tenants.access import ERASE, INGEST, READ
from tenants.permissions import TenantScopedViewMixin


def read_json_body(request: Request) -> Any:
    """The request body as JSON, refusing an oversized body from its Content-Length before a byte
    of it is read (so a 50 MB upload costs nothing and answers 413, not Django's generic 400)."""
    limit = settings.SAGAPLANE_MAX_BODY_BYTES
    declared = request.META.get("CONTENT_LENGTH") or ""
    if declared:
        size = ascii_int(declared)
        if size is None:
            raise DomainError("invalid", "Content-Length is not a number", field="Content-Length")
        if size > limit:
            raise DomainError(
                "too_large",
                f"body of {size} bytes exceeds the limit of {limit} bytes",
                status=413,
                context={"limit": limit},
            )
    raw = request._request.read(limit + 1)
    if len(raw) > limit:
        raise DomainError(
            "too_large", f"body exceeds the limit of {limit} bytes", status=413, context={"limit": limit}
        )
    try:
        return json.loads(raw, object_pairs_hook=_object_without_duplicate_keys)
    except DuplicateKey as exc:
        raise DomainError("duplicate_key", f"body: an object names {exc.key!r} twice", field="body")
    except RecursionError:
        # The parser recurses per level; ten thousand '[' must not become a 500.
        raise DomainError("too_deep", "body: nested too deeply to parse", field="body")
    except (ValueError, UnicodeDecodeError) as exc:
        raise DomainError("malformed_json", f"body is not valid JSON: {exc}", field="body")


class DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key[:100]


def _object_without_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object hook: a key given twice is refused (json.loads would keep the last one
    silently, so what was hashed and what is stored could differ between two readers)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


def records_from_body(body: Any) -> list[Any]:
    if not isinstance(body, dict):
        raise DomainError("invalid", "body: must be an object with a 'records' list", field="body")
    records = body.get("records")
    if not isinstance(records, list):
        raise DomainError("invalid", "records: required, a list of record objects", field="records")
    limit = settings.SAGAPLANE_MAX_BATCH_RECORDS
    if len(records) > limit:
        raise DomainError(
            "too_many_records",
            f"{len(records)} records exceed the limit of {limit} per batch",
            status=413,
            context={"limit": limit},
        )
    if not records:
        raise DomainError("invalid", "records: empty batch", field="records")
    return records


HEAD = inline_serializer(
    "StreamHead", {"seq": serializers.IntegerField(allow_null=True), "hash": serializers.CharField()}
)
ERROR = inline_serializer(
    "ApiErrorBody", {"error": serializers.CharField(), "detail": serializers.CharField()}
)
CHAIN_ERROR = inline_serializer(
    "ChainBroken",
    {
        "error": serializers.CharField(),
        "detail": serializers.CharField(),
        "seq": serializers.IntegerField(),
        "index": serializers.IntegerField(),
        "reason": serializers.CharField(),
    },
)
RECORDS_BODY = inline_serializer(
    "RecordBatch",
    {
        "records": serializers.ListField(child=serializers.DictField()),
        "stream": serializers.CharField(required=False),
    },
)


class StreamRecordsView(TenantScopedViewMixin, APIView):
    """Append a batch of hash-chained WAL records to one stream: verified, whole or not at all."""

    access = {"POST": INGEST}

    @extend_schema(
        operation_id="streams_records_append",
        request=RECORDS_BODY,
        responses={
            200: inline_serializer(
                "IngestAccepted",
                {
                    "stream": serializers.CharField(),
                    "accepted": serializers.IntegerField(),
                    "duplicates": serializers.IntegerField(),
                    "head": HEAD,
                },
            ),
            400: ERROR,
            409: CHAIN_ERROR,
            413: ERROR,
            422: CHAIN_ERROR,
        },
    )
    def post(self, request: Request, stream_id: str) -> Response:
        with timing.phase("parse"):
            body = read_json_body(request)
            records = records_from_body(body)
        named = body.get("stream")
        if named is not None and named != stream_id:
            raise DomainError(
                "mixed_streams",
                f"stream: body names '{named}' but the URL names '{stream_id}'",
                field="stream",
            )
        result = services.ingest(self.tenant, stream_id, records, actor=self.actor)
        return Response(result.as_dict())


class StreamDetailView(TenantScopedViewMixin, APIView):
    """A stream's head and counts."""

    access = {"GET": READ}

    @extend_schema(
        operation_id="streams_retrieve",
        responses={
            200: inline_serializer(
                "StreamDetail",
                {
                    "stream": serializers.CharField(),
                    "kind": serializers.CharField(),
                    "head": HEAD,
                    "length": serializers.IntegerField(),
                    "redacted": serializers.IntegerField(),
                    "first_leaf_index": serializers.IntegerField(allow_null=True),
                    "created_at": serializers.DateTimeField(),
                    "updated_at": serializers.DateTimeField(),
                },
            ),
            404: ERROR,
        },
    )
    def get(self, request: Request, stream_id: str) -> Response:
        stream = Stream.objects.filter(stream_id=stream_id).first()
        if stream is None:
            raise DomainError("not_found", "no such stream", status=404)
        records = Record.objects.filter(stream=stream)
        redacted = (
            records.exclude(redacted="").count() + Redaction.objects.filter(record__stream=stream).count()
        )
        return Response(
            {
                "stream": stream.stream_id,
                "kind": stream.kind,
                "head": {"seq": stream.head_seq, "hash": stream.head_hash},
                "length": stream.length,
                "redacted": redacted,
                "first_leaf_index": records.order_by("position").values_list("leaf_index", flat=True).first(),
                "created_at": stream.created_at,
                "updated_at": stream.updated_at,
            }
        )


class RedactionSerializer(serializers.Serializer):
    stream = serializers.CharField(max_length=200)
    position = serializers.IntegerField(min_value=1, required=False)
    hash = serializers.RegexField(r"^[0-9a-f]{64}$", required=False)
    reason = serializers.CharField(max_length=500)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("position" in attrs) == ("hash" in attrs):
            raise serializers.ValidationError({"position": ["give exactly one of position or hash"]})
        return attrs


class RedactionView(TenantScopedViewMixin, APIView):
    """Erase one record's payload and salt (people with the audit capability only; not API keys).
    The chain still verifies; the act is appended to the tenant's server stream."""

    access = {"POST": ERASE}

    @extend_schema(
        operation_id="audit_redactions_create",
        request=RedactionSerializer,
        responses={
            201: inline_serializer(
                "RedactionDone",
                {
                    "stream": serializers.CharField(),
                    "position": serializers.IntegerField(),
                    "hash": serializers.CharField(),
                    "reason": serializers.CharField(),
                    "actor": serializers.CharField(),
                    "server_record": inline_serializer(
                        "ServerRecordRef",
                        {
                            "stream": serializers.CharField(),
                            "position": serializers.IntegerField(),
                            "hash": serializers.CharField(),
                        },
                    ),
                },
            ),
            400: ERROR,
            403: ERROR,
            404: ERROR,
            409: ERROR,
        },
    )
    def post(self, request: Request) -> Response:
        serializer = RedactionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        redaction = services.redact(
            self.tenant,
            data["stream"],
            position=data.get("position"),
            record_hash_=data.get("hash"),
            reason=data["reason"],
            actor=self.actor,
        )
        record = redaction.record
        server = redaction.server_record
        assert server is not None, "redact() writes its server-stream record in the same transaction"
        return Response(
            {
                "stream": record.stream.stream_id,
                "position": record.position,
                "hash": record.h,
                "reason": redaction.reason,
                "actor": redaction.actor,
                "server_record": {
                    "stream": server.stream.stream_id,
                    "position": server.position,
                    "hash": server.h,
                },
            },
            status=status.HTTP_201_CREATED,
        )
