"""What the auditor receives: a saga disclosure (JSON) and the files of a WORM export.

Formats are defined by the SDK's offline verifiers (`sagaplane.disclosure`, `sagaplane.export`);
the server builds exactly what they check. Hashes are base64 throughout, as in C2SP.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from collections.abc import Callable
from typing import IO, Any

# `import a.b as c`: written `from sagaplane import disclosure`, a warm mypy cache has reported
# these two submodules (which the package's __init__ does not import) missing (cf. python/mypy#6816).
import sagaplane.disclosure as sdk_disclosure
import sagaplane.export as sdk_export
from sagaplane.chain import canonical

from audit.jsonvalues import served
from core.errors import DomainError
from core.scoping import require_tenant
from tenants.models import Tenant
from transparency import keys, proofs, sources, witnesses
from transparency.models import Checkpoint, Export, ExportStatus
from transparency.services import SEAL_EVENT, exact_saga_id, verifiers
from transparency.sources import LeafRecord


class BundleUnavailable(DomainError):
    """A disclosure or export cannot be built: no such saga, no seal or checkpoint yet, a range
    outside the log (4xx), or stored leaves missing (a 500)."""


def _entry(record: LeafRecord, proof: list[bytes]) -> dict[str, Any]:
    return {
        "leaf_index": record.leaf_index,
        "stream": record.stream_id,
        "position": record.position,
        # `record`, plus `record_json` when it holds NaN or Infinity (audit.jsonvalues)
        **served(record.record),
        "inclusion": [sdk_disclosure.b64(h) for h in proof],
    }


def disclosure(tenant: Tenant, saga_id: str) -> dict[str, Any]:
    """One saga, proven complete by its latest seal, against the latest signed checkpoint.
    Runs with the tenant active; nothing of any other saga is read into the bundle."""
    records = sources.saga_records(tenant, saga_id)
    if not records:
        raise BundleUnavailable("not_found", "no such saga in this tenant", status=404)
    seals = [r for r in records if r.record.get("event") == SEAL_EVENT]
    if not seals:
        raise BundleUnavailable(
            "not_sealed",
            "the saga has no seal yet: it is sealed when it reaches a terminal state",
            status=409,
        )
    seal = seals[-1]
    checkpoint = witnesses.proving_checkpoint(seal.leaf_index + 1)
    if checkpoint is None or seal.leaf_index >= checkpoint.size:
        raise BundleUnavailable(
            "not_integrated",
            "the saga's seal is not in a signed checkpoint yet; retry in a second",
            status=409,
        )
    listed = {(leaf, h) for leaf, h in seal.record.get("leaves", [])}
    shown = [r for r in records if (r.leaf_index, r.record.get("_h")) in listed and r is not seal]
    paths = proofs.inclusions([r.leaf_index for r in shown] + [seal.leaf_index], checkpoint.size)
    later = [r for r in records if r.leaf_index > seal.leaf_index]
    return {
        "format": sdk_disclosure.FORMAT,
        "origin": keys.log_origin(tenant),
        "saga_id": exact_saga_id(shown, saga_id),
        "hash_encoding": "base64",
        "checkpoint": witnesses.cosigned_note(checkpoint),
        "server_stream": sources.server_stream_id(),
        "records": [_entry(r, paths[r.leaf_index]) for r in shown],
        "seal": _entry(seal, paths[seal.leaf_index]),
        # Records logged after the seal (not yet covered by a newer seal) are not disclosed.
        "records_after_seal": len(later),
        "rule": sdk_disclosure.RULE,
    }


def resolve_range(tenant: Tenant, export: Export, checkpoint: Checkpoint) -> tuple[int, int]:
    if export.first is not None or export.end is not None:
        first = export.first or 0
        end = checkpoint.size if export.end is None else export.end
    elif export.since is not None or export.until is not None:
        first, end = sources.leaf_range_for_time(tenant, export.since, export.until)
        end = min(end, checkpoint.size)
        first = min(first, end)
    else:
        first, end = 0, checkpoint.size
    if not 0 <= first <= end <= checkpoint.size:
        raise BundleUnavailable("invalid_range", f"leaf range [{first}, {end}) is not within the signed log")
    return first, end


def manifest_for(
    tenant: Tenant, export: Export, checkpoint: Checkpoint, previous: Export | None, first: int, end: int
) -> dict[str, Any]:
    """The manifest minus what depends on the records file (sha256, stream heads)."""
    manifest: dict[str, Any] = {
        "format": sdk_export.FORMAT,
        "export_id": str(export.pk),
        "tenant": tenant.slug,
        "origin": keys.log_origin(tenant),
        "hash_encoding": "base64",
        "first": first,
        "end": end,
        "record_count": end - first,
        "checkpoint": witnesses.cosigned_note(checkpoint),
        "checkpoint_size": checkpoint.size,
        "prefix_frontier": [sdk_disclosure.b64(h) for h in proofs.prefix_frontier(first)],
        "end_consistency": (
            [sdk_disclosure.b64(h) for h in proofs.consistency(end, checkpoint.size)[1]]
            if 0 < end < checkpoint.size
            else []
        ),
        # Informational only: an auditor must take the key from the tenant, never from the bundle.
        "verifier_keys": [v.encode() for v in verifiers(include_retired=False)],
        "previous": None,
        "rule": sdk_export.RULE,
    }
    if previous is not None and previous.checkpoint is not None:
        prev_size = previous.checkpoint.size
        consistency = (
            proofs.consistency(prev_size, checkpoint.size)[1] if 0 < prev_size < checkpoint.size else []
        )
        manifest["previous"] = {
            "export_id": str(previous.pk),
            "checkpoint": previous.checkpoint.note,
            "size": prev_size,
            "consistency": [sdk_disclosure.b64(h) for h in consistency],
        }
    return manifest


def records_chunk(tenant: Tenant, start: int, stop: int) -> list[LeafRecord]:
    """Leaves [start, stop) of the tenant's log with their records, in leaf order (one chunk of
    an export, read in the tenant the caller entered)."""
    require_tenant(tenant)
    return list(sources.records(tenant, start, stop))


def write_records(
    first: int,
    end: int,
    out: IO[bytes],
    progress: Callable[[int], None],
    read: Callable[[int, int], list[LeafRecord]],
    chunk: int = 5_000,
) -> tuple[str, dict[str, dict[str, Any]]]:
    """records.ndjson into `out`, in leaf order; returns its sha256 and the stream heads.
    `read(start, stop)` reads a chunk (`records_chunk`, each in a transaction of its own as the
    tenant, entered by the caller), and `progress(done)` is called between chunks."""
    digest = hashlib.sha256()
    heads: dict[str, dict[str, Any]] = {}
    done = 0
    for start in range(first, end, chunk):
        rows = read(start, min(end, start + chunk))
        for row in rows:
            if row.leaf_index != first + done:
                raise BundleUnavailable(
                    "leaf_gap", f"leaf {first + done} is missing from the record store", status=500
                )
            line = (
                canonical(
                    {
                        "leaf_index": row.leaf_index,
                        "stream": row.stream_id,
                        "position": row.position,
                        "record": row.record,
                    }
                )
                + b"\n"
            )
            digest.update(line)
            out.write(line)
            heads[row.stream_id] = {"position": row.position, "hash": row.record.get("_h")}
            done += 1
        progress(done)
    if done != end - first:
        raise BundleUnavailable("leaf_gap", f"only {done} of {end - first} records could be read", status=500)
    return digest.hexdigest(), heads


def pack_export(records_file: IO[bytes], manifest: dict[str, Any], checkpoint_note: str) -> IO[bytes]:
    """A tar.gz (records.ndjson, manifest.json, checkpoint) in a temporary file, streamed."""
    # The caller owns and closes the temporary file (it is returned, then streamed to storage).
    archive = tempfile.TemporaryFile()  # noqa: SIM115
    manifest_bytes = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    records_file.seek(0, 2)
    sizes = {"records.ndjson": records_file.tell(), "manifest.json": len(manifest_bytes)}
    records_file.seek(0)
    with tarfile.open(fileobj=archive, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, body in (
            ("records.ndjson", records_file),
            ("manifest.json", io.BytesIO(manifest_bytes)),
            ("checkpoint", io.BytesIO(checkpoint_note.encode())),
        ):
            info = tarfile.TarInfo(name)
            info.size = sizes.get(name, len(checkpoint_note.encode()))
            info.mode = 0o444
            tar.addfile(info, body)
    archive.seek(0)
    return archive


__all__ = ["BundleUnavailable", "ExportStatus", "disclosure", "manifest_for", "pack_export", "resolve_range"]
