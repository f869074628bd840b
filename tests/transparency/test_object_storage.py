"""Exports and full tiles in object storage, through the S3 API, against a local server that
speaks it (moto's server mode, over HTTP: a stand-in for S3, which this machine cannot reach;
the same code talks to S3). Write once: the store itself refuses a second write of a name, and
with a retention period the object is locked against deletion."""

from __future__ import annotations

import hashlib
import io
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer
from sagaplane.export import verify_export

from tenants.models import Tenant
from tests.support.chains import Writer
from tests.support.factories import Person
from tests.support.transparency import settle
from transparency.storage import WriteOnceS3Storage, get_storage

API = "/api/v1/audit"
S3 = "transparency.storage.WriteOnceS3Storage"


class Bucket:
    def __init__(self, client: Any, name: str) -> None:
        self.client = client
        self.name = name

    def keys(self, prefix: str = "") -> set[str]:
        listed = self.client.list_objects_v2(Bucket=self.name, Prefix=prefix)
        return {item["Key"] for item in listed.get("Contents", [])}

    def read(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[Bucket]:
    # A bucket of this test's own (moto keeps its buckets per process, across servers).
    bucket = f"sagaplane-{uuid.uuid4().hex[:12]}"
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # Credentials reach boto3 the way production's do: its own environment variables.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test-access-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret-key")
    settings.AWS_S3_ENDPOINT_URL = endpoint
    settings.AWS_STORAGE_BUCKET_NAME = bucket
    settings.AWS_S3_REGION_NAME = "us-east-1"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    try:
        yield Bucket(client, bucket)
    finally:
        server.stop()


def test_an_object_is_written_once_and_locked(s3: Bucket) -> None:
    storage = WriteOnceS3Storage("exports", retention_days=1)
    assert not storage.exists("a/b.tar.gz")
    storage.create("a/b.tar.gz", io.BytesIO(b"first"))
    assert storage.exists("a/b.tar.gz")
    with pytest.raises(FileExistsError):
        storage.create("a/b.tar.gz", io.BytesIO(b"second"))
    with storage.open("a/b.tar.gz") as stored:
        assert stored.read() == b"first"
    head = s3.client.head_object(Bucket=s3.name, Key="exports/a/b.tar.gz")
    assert head["ObjectLockMode"] == "COMPLIANCE"
    (version,) = s3.client.list_object_versions(Bucket=s3.name, Prefix="exports/a/b.tar.gz")["Versions"]
    with pytest.raises(ClientError) as refused:
        s3.client.delete_object(Bucket=s3.name, Key="exports/a/b.tar.gz", VersionId=version["VersionId"])
    assert refused.value.response["Error"]["Code"] == "AccessDenied"


def test_a_name_outside_the_prefix_is_not_reachable(s3: Bucket) -> None:
    storage = WriteOnceS3Storage("exports")
    with pytest.raises(Exception, match="outside|escapes|Attempted access"):
        storage.create("../elsewhere", io.BytesIO(b"x"))
    assert s3.keys() == set()


def test_an_export_is_built_into_object_storage_and_verifies(
    s3: Bucket,
    settings: Any,
    tenant_a: Tenant,
    alice: Person,
    writer_a: Writer,
    django_capture_on_commit_callbacks: Any,
    tmp_path: Path,
) -> None:
    from controlplane.celery import app

    settings.SAGAPLANE_EXPORT_STORAGE = {"BACKEND": S3, "OPTIONS": {"location": "exports"}}
    writer_a.saga("s1")
    settle(tenant_a)
    client = alice.session_client()
    previous, app.conf.task_always_eager = app.conf.task_always_eager, True
    try:
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(f"{API}/exports", {}, format="json")
    finally:
        app.conf.task_always_eager = previous
    assert response.status_code == 202, response.content
    status = client.get(f"{API}/exports/{response.json()['id']}").json()
    assert status["status"] == "done", status
    (key,) = s3.keys("exports/")
    stored = s3.read(key)
    assert hashlib.sha256(stored).hexdigest() == status["sha256"]
    download = client.get(f"{API}/exports/{status['id']}/download")
    assert b"".join(download.streaming_content) == stored
    path = tmp_path / "export.tar.gz"
    path.write_bytes(stored)
    verifier = alice.key_client().get(f"{API}/key").content.decode().splitlines()[0]
    assert verify_export(str(path), verifier).records == status["records_total"]
    # The object store, not this process, refuses a second write of the name.
    with pytest.raises(FileExistsError):
        get_storage().create(key.removeprefix("exports/"), io.BytesIO(b"tampered"))


def test_full_tiles_are_published_once_immutable_and_partial_ones_never(
    s3: Bucket, settings: Any, tenant_a: Tenant, alice: Person, writer_a: Writer
) -> None:
    settings.SAGAPLANE_TILE_STORAGE = {
        "BACKEND": S3,
        "OPTIONS": {"location": "tiles", "cache_control": "public, max-age=31536000, immutable"},
    }
    for n in range(52):  # 5 records each: past 256 leaves, so level-0 tile 000 is full
        writer_a.saga(f"t{n}", steps=2)
    settle(tenant_a)
    client = alice.key_client()
    full = client.get(f"{API}/tile/0/000")
    assert full.status_code == 200, full.content
    assert len(full.content) == 32 * 256
    assert "immutable" in full["Cache-Control"] and "max-age=31536000" in full["Cache-Control"]
    stored = s3.client.get_object(Bucket=s3.name, Key=f"tiles/{tenant_a.slug}/tile/0/000")
    assert stored["Body"].read() == full.content
    assert stored["CacheControl"] == "public, max-age=31536000, immutable"
    bundle = client.get(f"{API}/tile/entries/000")
    assert bundle.status_code == 200
    assert (
        s3.client.get_object(Bucket=s3.name, Key=f"tiles/{tenant_a.slug}/tile/entries/000")["Body"].read()
        == bundle.content
    )
    # Read again: served the same, nothing rewritten; a partial tile is never published.
    assert client.get(f"{API}/tile/0/000").content == full.content
    (version,) = s3.client.list_object_versions(Bucket=s3.name, Prefix=f"tiles/{tenant_a.slug}/tile/0/000")[
        "Versions"
    ]
    assert version["IsLatest"]
    partial = client.get(f"{API}/tile/1/000.p/1")
    assert partial.status_code == 200
    assert s3.keys("tiles/") == {
        f"tiles/{tenant_a.slug}/tile/0/000",
        f"tiles/{tenant_a.slug}/tile/entries/000",
    }
