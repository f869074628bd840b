"""Read API of the transparency log (ARCHITECTURE §8). Every view inherits the tenant mixin:
the log, its proofs and tiles are the requesting tenant's only.

Proof JSON carries hashes in standard base64 (as C2SP checkpoints and tlog-proof do), leaf side
first; sizes beyond the latest signed checkpoint are refused so no proof is ever served against
a root nobody signed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, overload

from django.http import FileResponse, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from sagaplane import merkle
from sagaplane.disclosure import b64

from controlplane.schema import ErrorSerializer
from core.errors import DomainError
from core.numbers import ascii_int
from tenants.access import AUDIT, READ
from tenants.permissions import TenantScopedViewMixin
from transparency import bundles, proofs, services, witnesses
from transparency.models import Export, ExportStatus
from transparency.storage import get_storage, publish_full_tile

PROOF_SCHEMA = inline_serializer(
    "Proof",
    {
        "size": serializers.IntegerField(),
        "hash_encoding": serializers.CharField(),
        "hashes": serializers.ListField(child=serializers.CharField()),
    },
)


@overload
def _int_param(query: Mapping[str, str], name: str, *, required: Literal[True]) -> int: ...
@overload
def _int_param(query: Mapping[str, str], name: str, *, required: Literal[False]) -> int | None: ...
def _int_param(query: Mapping[str, str], name: str, *, required: bool) -> int | None:
    raw = query.get(name)
    if raw is None or raw == "":
        if required:
            raise DomainError("invalid", f"{name}: required", field=name)
        return None
    number = ascii_int(raw, max_digits=20)
    if number is None:
        raise DomainError("invalid", f"{name}: must be a non-negative integer", field=name)
    return number


class LogView(TenantScopedViewMixin, APIView):
    access = {"GET": READ}


class CheckpointView(LogView):
    """The latest signed checkpoint (C2SP signed note), as text/plain."""

    statement_scoped = True  # reads only; nodes never change, checkpoints only grow

    @extend_schema(responses={(200, "text/plain"): OpenApiTypes.STR})
    def get(self, request: Request) -> HttpResponse:
        checkpoint = proofs.latest_checkpoint()
        if checkpoint is None:
            raise DomainError("no_checkpoint", "the log has no signed checkpoint yet", status=404)
        # The log's signature, then every witness cosignature gathered for this checkpoint.
        response = HttpResponse(witnesses.cosigned_note(checkpoint), content_type="text/plain; charset=utf-8")
        response["Cache-Control"] = "no-cache"
        return response


class KeyView(LogView):
    """Verifier key strings, one per line: the active key first, then any key being rotated out.
    `?all=1` adds retired keys (still needed to verify old checkpoints). A read never writes: a
    tenant's first key is made by the integrator with its first checkpoint; until then, 404."""

    @extend_schema(responses={(200, "text/plain"): OpenApiTypes.STR})
    def get(self, request: Request) -> HttpResponse:
        keys = services.current_verifier_keys(include_retired=request.query_params.get("all") == "1")
        if not keys:
            raise DomainError(
                "no_signing_key",
                "the log has no signing key yet (none before its first checkpoint)",
                status=404,
            )
        return HttpResponse("".join(f"{k}\n" for k in keys), content_type="text/plain; charset=utf-8")


class InclusionProofView(LogView):
    """RFC 9162 inclusion proof of leaf `index` in the tree of `size` (default: latest checkpoint)."""

    statement_scoped = True  # reads only; nodes never change, checkpoints only grow

    @extend_schema(
        parameters=[OpenApiParameter("index", int, required=True), OpenApiParameter("size", int)],
        responses=PROOF_SCHEMA,
    )
    def get(self, request: Request) -> Response:
        return Response(self.answer(request.query_params))

    @staticmethod
    def answer(query: Mapping[str, str]) -> dict[str, Any]:
        """The proof the query asks for (the view's and the lean path's, transparency.lean)."""
        index = _int_param(query, "index", required=True)
        size = _int_param(query, "size", required=False)
        size, path, leaf = proofs.inclusion(index, size)
        return {
            "index": index,
            "size": size,
            "leaf_hash": b64(leaf),
            "hash_encoding": "base64",
            "hashes": [b64(h) for h in path],
        }


class ConsistencyProofView(LogView):
    """RFC 9162 consistency proof between tree sizes `first` and `second` (default: latest)."""

    statement_scoped = True  # reads only; nodes never change, checkpoints only grow

    @extend_schema(
        parameters=[OpenApiParameter("first", int, required=True), OpenApiParameter("second", int)],
        responses=PROOF_SCHEMA,
    )
    def get(self, request: Request) -> Response:
        return Response(self.answer(request.query_params))

    @staticmethod
    def answer(query: Mapping[str, str]) -> dict[str, Any]:
        """The proof the query asks for (the view's and the lean path's, transparency.lean)."""
        first = _int_param(query, "first", required=True)
        second = _int_param(query, "second", required=False)
        second, path = proofs.consistency(first, second)
        return {
            "first": first,
            "second": second,
            "size": second,
            "hash_encoding": "base64",
            "hashes": [b64(h) for h in path],
        }


class TileView(LogView):
    """C2SP tlog-tiles hash tile `tile/<L>/<N>[.p/<W>]` (binary, 32-byte hashes)."""

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    def get(self, request: Request, level: int, tile: str) -> HttpResponse:
        try:
            parsed = merkle.parse_tile_path(f"tile/{level}/{tile}")
            data = proofs.tile(parsed.level, parsed.index, parsed.width)
        except merkle.TilePathError as exc:
            raise DomainError("invalid", f"tile: {exc}", field="tile") from None
        if parsed.width == merkle.TILE_WIDTH:  # a full tile: published to the tile store once
            publish_full_tile(self.tenant.slug, merkle.tile_path(parsed.level, parsed.index), data)
        response = HttpResponse(data, content_type="application/octet-stream")
        # A tile at a given width never changes: full and partial tiles are immutable.
        response["Cache-Control"] = "public, max-age=31536000, immutable"
        return response


class ProofBundleView(LogView):
    """Offline proof file (C2SP tlog-proof v1, text/plain) for leaf `index` against the latest
    signed checkpoint the witnesses' quorum cosigned, the record as extra data; verify with
    `sagaplane verify-proof FILE --policy POLICY` (the policy: `GET witnesses/policy`)."""

    @extend_schema(
        parameters=[OpenApiParameter("index", int, required=True)],
        responses={(200, "text/plain"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> HttpResponse:
        index = _int_param(request.query_params, "index", required=True)
        text = proofs.proof_file(self.tenant, index)
        response = HttpResponse(text, content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'inline; filename="leaf-{index}.tlog-proof"'
        response["Cache-Control"] = "no-cache"  # it names the latest checkpoint, which moves
        return response


class EntryBundleView(LogView):
    """C2SP tlog-tiles entry bundle `tile/entries/<N>[.p/<W>]`: the leaf data of 256 leaves (or W),
    each a big-endian uint16 length then the bytes; `leaf_hash` of each is the level-0 tile."""

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    def get(self, request: Request, bundle: str) -> HttpResponse:
        try:
            # Same index/width grammar as a level-0 hash tile; parse it strictly as one.
            parsed = merkle.parse_tile_path(f"tile/0/{bundle}")
            data = proofs.entry_bundle(self.tenant, parsed.index, parsed.width)
        except merkle.TilePathError as exc:
            raise DomainError(
                "invalid", f"tile: {str(exc).replace('tile/0/', 'tile/entries/')}", field="tile"
            ) from None
        if parsed.width == merkle.TILE_WIDTH:
            publish_full_tile(self.tenant.slug, merkle.entries_tile_path(parsed.index), data)
        response = HttpResponse(data, content_type="application/octet-stream")
        # Leaf data never changes (erasure keeps the header and its hash), so bundles are immutable.
        response["Cache-Control"] = "public, max-age=31536000, immutable"
        return response


class DisclosureView(LogView):
    """One saga's records with inclusion proofs, its seal and the signed checkpoint (JSON),
    verifiable offline with `sagaplane verify-disclosure FILE --key VERIFIER_KEY`."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 409: ErrorSerializer})
    def get(self, request: Request, saga_id: str) -> Response:
        return Response(bundles.disclosure(self.tenant, saga_id))


class ExportSerializer(serializers.ModelSerializer):
    progress = serializers.FloatField(read_only=True)

    class Meta:
        model = Export
        fields = [
            "id",
            "status",
            "progress",
            "first",
            "end",
            "since",
            "until",
            "records_done",
            "records_total",
            "sha256",
            "requested_by",
            "error",
            "created_at",
            "finished_at",
        ]
        read_only_fields = [f for f in fields if f not in ("first", "end", "since", "until")]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for name in ("first", "end"):
            if attrs.get(name) is not None and attrs[name] < 0:
                raise serializers.ValidationError({name: "must be a non-negative integer"})
        if attrs.get("first") is not None and attrs.get("end") is not None and attrs["first"] > attrs["end"]:
            raise serializers.ValidationError({"first": "must not be greater than end"})
        if (attrs.get("first") is not None or attrs.get("end") is not None) and (
            attrs.get("since") or attrs.get("until")
        ):
            raise serializers.ValidationError({"since": "give a leaf range or a time range, not both"})
        latest = proofs.latest_checkpoint()
        signed = latest.size if latest is not None else 0
        if attrs.get("end") is not None and attrs["end"] > signed:
            raise serializers.ValidationError({"end": f"beyond the latest signed checkpoint (size {signed})"})
        return attrs


class ExportListView(LogView):
    """POST: start a WORM export (auditor, admin or owner, or a key with `audit`) — 202 with its
    id. GET: the exports."""

    access = {"GET": AUDIT, "POST": AUDIT}

    @extend_schema(request=ExportSerializer, responses={202: ExportSerializer})
    def post(self, request: Request) -> Response:
        serializer = ExportSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        export = services.request_export(self.tenant, actor=self.actor, **serializer.validated_data)
        return Response(ExportSerializer(export).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=ExportSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(ExportSerializer(Export.objects.order_by("-created_at")[:100], many=True).data)


class ExportDetailView(LogView):
    """An export's status and progress."""

    access = {"GET": AUDIT}

    @extend_schema(responses=ExportSerializer)
    def get(self, request: Request, export_id: Any) -> Response:
        export = Export.objects.filter(pk=export_id).first()
        if export is None:
            raise DomainError("not_found", "no such export in this tenant", status=404)
        return Response(ExportSerializer(export).data)


class ExportDownloadView(LogView):
    """The export's tar.gz (records.ndjson, manifest.json, checkpoint)."""

    access = {"GET": AUDIT}

    @extend_schema(responses={(200, "application/gzip"): OpenApiTypes.BINARY, 409: ErrorSerializer})
    def get(self, request: Request, export_id: Any) -> FileResponse:
        export = Export.objects.filter(pk=export_id).first()
        if export is None:
            raise DomainError("not_found", "no such export in this tenant", status=404)
        if export.status != ExportStatus.DONE:
            raise DomainError(
                "not_ready", f"the export is {export.status}", status=409, context={"status": export.status}
            )
        # Recorded in the request's transaction: if the file cannot be opened, neither stays.
        services.record_export_download(self.tenant, export, actor=self.actor)
        response = FileResponse(
            get_storage().open(export.storage_name),
            content_type="application/gzip",
            as_attachment=True,
            filename=f"sagaplane-export-{export.pk}.tar.gz",
        )
        response["X-Content-SHA256"] = export.sha256
        return response
