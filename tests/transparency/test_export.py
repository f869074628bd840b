"""WORM exports: requested over the API, built by the Celery task with progress, stored write
once, downloaded, verified offline (SDK and CLI), and every tampered copy refused."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest
from sagaplane import cli
from sagaplane.disclosure import VerificationError
from sagaplane.export import pack, verify_export, verify_export_files

from core.scoping import tenant_context
from tenants.models import Tenant
from tests.support.chains import Writer, server_stream
from tests.support.factories import Person
from tests.support.transparency import settle
from transparency.models import Export
from transparency.storage import WriteOnceFileStorage

API = "/api/v1/audit"


@pytest.fixture(autouse=True)
def _eager_celery_and_private_storage(settings: Any, tmp_path: Path) -> None:
    from controlplane.celery import app

    settings.SAGAPLANE_EXPORT_STORAGE = {
        "BACKEND": "transparency.storage.WriteOnceFileStorage",
        "OPTIONS": {"location": str(tmp_path / "exports")},
    }
    previous = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = previous


def _export(person: Person, capture: Any, body: dict | None = None) -> tuple[dict, bytes]:
    client = person.session_client()
    with capture(execute=True):
        response = client.post(f"{API}/exports", body or {}, format="json")
    assert response.status_code == 202, response.content
    export_id = response.json()["id"]
    status = client.get(f"{API}/exports/{export_id}").json()
    assert status["status"] == "done", status
    assert status["progress"] == 1.0 and status["records_done"] == status["records_total"]
    download = client.get(f"{API}/exports/{export_id}/download")
    assert download.status_code == 200 and download["Content-Type"] == "application/gzip"
    data = b"".join(download.streaming_content)
    assert hashlib.sha256(data).hexdigest() == status["sha256"] == download["X-Content-SHA256"]
    return status, data


def _files(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


@pytest.fixture
def exported(
    tenant_a: Tenant, alice: Person, writer_a: Writer, django_capture_on_commit_callbacks: Any, tmp_path: Path
) -> dict[str, Any]:
    writer_a.saga("s1")
    Writer(tenant_a, "agent-a-2").saga("s2", steps=3)
    settle(tenant_a)
    first_status, first = _export(alice, django_capture_on_commit_callbacks)
    old_note = _files(first)["checkpoint"]
    writer_a.saga("s3")
    settle(tenant_a)
    status, data = _export(alice, django_capture_on_commit_callbacks)
    key = alice.key_client().get(f"{API}/key").content.decode().splitlines()[0]
    path = tmp_path / "export.tar.gz"
    path.write_bytes(data)
    return {
        "path": path,
        "data": data,
        "files": _files(data),
        "key": key,
        "old_note": old_note,
        "status": status,
        "first_status": first_status,
    }


def test_a_real_export_verifies(exported: dict[str, Any], capsys: pytest.CaptureFixture) -> None:
    report = verify_export(str(exported["path"]), exported["key"])
    manifest = json.loads(exported["files"]["manifest.json"])
    assert report.records == manifest["record_count"] == manifest["end"] - manifest["first"]
    assert report.previous_size == json.loads(exported["files"]["manifest.json"])["previous"]["size"]
    assert manifest["records_sha256"] == hashlib.sha256(exported["files"]["records.ndjson"]).hexdigest()
    assert manifest["tenant"] == "acme" and manifest["origin"] == "sagaplane.local/acme"
    assert set(manifest["stream_heads"]) >= {"agent-a-1", "agent-a-2", "server"}
    assert "sha256sum" in manifest["rule"]
    lines = exported["files"]["records.ndjson"].splitlines()
    assert [json.loads(line)["leaf_index"] for line in lines] == list(range(len(lines)))
    assert cli.main(["verify-export", str(exported["path"]), "--key", exported["key"]]) == 0
    assert "OK:" in capsys.readouterr().out


def _lines(files: dict[str, bytes]) -> list[bytes]:
    return files["records.ndjson"].splitlines(keepends=True)


def _rewrite(files: dict[str, bytes], lines: list[bytes], *, fix_hash: bool = True) -> None:
    files["records.ndjson"] = b"".join(lines)
    if fix_hash:  # the attacker also updates the manifest's hash, so the deeper checks must catch it
        manifest = json.loads(files["manifest.json"])
        manifest["records_sha256"] = hashlib.sha256(files["records.ndjson"]).hexdigest()
        manifest["record_count"] = len(lines)
        manifest["end"] = manifest["first"] + len(lines)
        files["manifest.json"] = json.dumps(manifest).encode()


def _payload_byte(files: dict[str, bytes]) -> None:
    lines = _lines(files)
    at = next(i for i, line in enumerate(lines) if b'"amount":10' in line)
    lines[at] = lines[at].replace(b'"amount":10', b'"amount":11')
    _rewrite(files, lines)


def _drop(files: dict[str, bytes]) -> None:
    lines = _lines(files)
    del lines[4]
    _rewrite(files, lines)


def _reorder(files: dict[str, bytes]) -> None:
    lines = _lines(files)
    lines[4], lines[5] = lines[5], lines[4]
    _rewrite(files, lines)


def _truncate(files: dict[str, bytes]) -> None:
    files["records.ndjson"] = files["records.ndjson"][: len(files["records.ndjson"]) // 2]


def _old_checkpoint(exported: dict[str, Any]) -> Any:
    def tamper(files: dict[str, bytes]) -> None:
        files["checkpoint"] = exported["old_note"]
        manifest = json.loads(files["manifest.json"])
        manifest["checkpoint"] = exported["old_note"].decode()
        files["manifest.json"] = json.dumps(manifest).encode()

    return tamper


def _foreign_record(files: dict[str, bytes]) -> None:
    lines = _lines(files)
    entry = json.loads(lines[-1])
    entry["leaf_index"] += 1
    entry["record"]["saga_id"] = "injected"
    lines.append(json.dumps(entry).encode() + b"\n")
    _rewrite(files, lines)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("payload byte changed", "content digest"),
        ("record dropped", "leaf index"),
        ("reordered", "leaf index"),
        ("records file truncated", "does not match the SHA-256"),
        ("older checkpoint swapped in", "beyond the checkpoint"),
        ("record added", "beyond the checkpoint"),
        ("checkpoint file differs", "differs from the checkpoint in manifest"),
    ],
)
def test_tampered_exports_are_refused(
    exported: dict[str, Any], name: str, reason: str, tmp_path: Path
) -> None:
    files = dict(exported["files"])
    tamper = {
        "payload byte changed": _payload_byte,
        "record dropped": _drop,
        "reordered": _reorder,
        "records file truncated": _truncate,
        "older checkpoint swapped in": _old_checkpoint(exported),
        "record added": _foreign_record,
        "checkpoint file differs": lambda f: f.__setitem__("checkpoint", exported["old_note"]),
    }[name]
    tamper(files)
    with pytest.raises(VerificationError, match=reason):
        verify_export_files(files, exported["key"])
    path = tmp_path / "bad.tar.gz"
    path.write_bytes(pack(files))
    assert cli.main(["verify-export", str(path), "--key", exported["key"]]) == 1


def test_signed_with_another_tenants_key_is_refused(
    exported: dict[str, Any], carol: Person, tenant_b: Tenant, writer_b: Writer
) -> None:
    writer_b.saga("b1")
    settle(tenant_b)
    bravo_key = carol.key_client().get(f"{API}/key").content.decode().splitlines()[0]
    with pytest.raises(VerificationError, match="signature does not verify"):
        verify_export(str(exported["path"]), bravo_key)
    bravo_note = carol.key_client().get(f"{API}/checkpoint").content
    files = dict(exported["files"])
    manifest = json.loads(files["manifest.json"])
    manifest["checkpoint"] = bravo_note.decode()
    files["checkpoint"], files["manifest.json"] = bravo_note, json.dumps(manifest).encode()
    with pytest.raises(VerificationError, match="signature does not verify"):
        verify_export_files(files, exported["key"])
    with tenant_context(tenant_b):
        assert not Export.objects.exists()
    export_id = exported["status"]["id"]
    assert carol.session_client().get(f"{API}/exports/{export_id}/download").status_code == 404


def test_export_file_is_write_once(exported: dict[str, Any], tenant_a: Tenant, settings: Any) -> None:
    storage = WriteOnceFileStorage(settings.SAGAPLANE_EXPORT_STORAGE["OPTIONS"]["location"])
    with tenant_context(tenant_a):
        name = Export.objects.get(pk=exported["status"]["id"]).storage_name
    path = storage._path(name)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o444
    with pytest.raises(FileExistsError):
        storage.create(name, io.BytesIO(b"overwrite"))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == exported["status"]["sha256"]


def test_partial_leaf_range_is_proven_against_the_checkpoint(
    exported: dict[str, Any], alice: Person, django_capture_on_commit_callbacks: Any
) -> None:
    status, data = _export(alice, django_capture_on_commit_callbacks, {"first": 3, "end": 9})
    report = verify_export_files(_files(data), exported["key"])
    assert (report.first, report.end, report.records) == (3, 9, 6) and report.size > 9


def test_bad_export_requests(exported: dict[str, Any], alice: Person) -> None:
    client = alice.session_client()
    response = client.post(f"{API}/exports", {"end": 10**6}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "end"
    response = client.post(f"{API}/exports", {"first": 5, "end": 2}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "first"


def test_export_requests_and_downloads_are_in_the_server_stream(
    tenant_a: Tenant, alice: Person, carol: Person, writer_a: Writer, django_capture_on_commit_callbacks: Any
) -> None:
    writer_a.saga("s1")
    settle(tenant_a)
    before = len(server_stream(tenant_a))
    status, _ = _export(alice, django_capture_on_commit_callbacks)
    events = [r for r in server_stream(tenant_a)[before:] if r["event"].startswith("AUDIT_EXPORT")]
    requested, downloaded = events
    assert requested["event"] == "AUDIT_EXPORT_REQUESTED" and requested["actor"] == "user:alice@acme.example"
    assert requested["export"] == status["id"] and requested["old"] is None
    assert requested["new"] == {"status": "queued", "first": None, "end": None, "since": None, "until": None}
    assert downloaded["event"] == "AUDIT_EXPORT_DOWNLOADED" and downloaded["actor"] == requested["actor"]
    assert downloaded["export"] == status["id"] and downloaded["sha256"] == status["sha256"]
    assert [downloaded["first"], downloaded["end"]] == [status["first"], status["end"]]
    # A refused download (another tenant's owner) records nothing, in either tenant.
    bravo_before = server_stream(carol.tenant)
    assert carol.session_client().get(f"{API}/exports/{status['id']}/download").status_code == 404
    assert server_stream(tenant_a)[-1] == downloaded
    assert server_stream(carol.tenant) == bravo_before


def test_exports_started_from_the_evidence_page_name_the_person(
    tenant_a: Tenant, alice: Person, writer_a: Writer
) -> None:
    from django.test import Client

    writer_a.saga("s1")
    settle(tenant_a)
    client = Client()
    client.force_login(alice.user)
    assert client.post("/evidence/exports").status_code == 302
    record = server_stream(tenant_a)[-1]
    assert record["event"] == "AUDIT_EXPORT_REQUESTED" and record["actor"] == "user:alice@acme.example"
