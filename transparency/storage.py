"""Write-once storage for WORM exports, selected by `SAGAPLANE_EXPORT_STORAGE`.

Embedded mode: files under SAGAPLANE_DATA_DIR/exports, left mode 0444. A file is written and
fsynced under a unique temporary name in the same folder, then published with link(2), which
is atomic and fails if the name exists: a reader (or a retried build) sees either no file or the
complete one, never a torn one, and an existing name is never overwritten. Production points the
setting at a backend with the same two methods over object storage with a retention lock
(e.g. S3 Object Lock in compliance mode), which is what makes "write once" hold against an
administrator rather than only against this process.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, Protocol

from django.conf import settings
from django.utils.module_loading import import_string

log = logging.getLogger(__name__)


class ExportStorage(Protocol):
    def create(self, name: str, source: IO[bytes]) -> None:
        """Store `source` under `name`; refuse (FileExistsError) if the name exists."""

    def open(self, name: str) -> IO[bytes]: ...

    def exists(self, name: str) -> bool:
        """Whether `name` has been published (a restarted build adopts it instead of rebuilding)."""


class WriteOnceFileStorage:
    def __init__(self, location: str | Path | None = None) -> None:
        self.location = Path(location or Path(settings.DATA_DIR) / "exports")

    def _path(self, name: str) -> Path:
        path = (self.location / name).resolve()
        if self.location.resolve() not in path.parents:
            raise ValueError(f"export name {name!r} escapes the export folder")
        return path

    def create(self, name: str, source: IO[bytes]) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            raise FileExistsError(str(path))  # cheap early refusal; link() below is the real guard
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(partial, 0o444)  # umask may have widened nothing, but be explicit
            os.link(partial, path)  # atomic publish; FileExistsError if the name is taken
        finally:
            # A build killed before this line leaves a dot-file partial, never a final name.
            partial.unlink(missing_ok=True)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the new name itself durable
        finally:
            os.close(dir_fd)

    def exists(self, name: str) -> bool:
        return self._path(name).exists()

    def open(self, name: str) -> IO[bytes]:
        return open(self._path(name), "rb")  # noqa: SIM115 - the caller streams and closes it


class WriteOnceS3Storage:
    """Object storage through the S3 API (AWS S3, or any server speaking it), for exports and full
    tiles. Connection, bucket, region and endpoint come from django-storages' settings
    (`AWS_STORAGE_BUCKET_NAME`, `AWS_S3_ENDPOINT_URL`, `AWS_S3_REGION_NAME`); credentials from
    boto3's usual chain (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, a role), never a setting.

    Write once: every object is created with a conditional PUT (`If-None-Match: *`), which the
    store itself refuses (412) when the name exists, so two builders racing on one name publish
    one object, and nothing here ever overwrites. An S3 PUT is atomic: a reader sees no object or
    the whole one. With `retention_days`, each object is also put under an Object Lock in
    compliance mode until then (the bucket must have Object Lock enabled): then no credential,
    an administrator's included, can delete or overwrite it before that date."""

    def __init__(
        self, location: str = "", *, retention_days: int = 0, cache_control: str = "", **options: Any
    ) -> None:
        from storages.backends.s3 import S3Storage

        self.storage = S3Storage(location=location.strip("/"), **options)
        self.retention_days = retention_days
        self.cache_control = cache_control

    def create(self, name: str, source: IO[bytes]) -> None:
        from botocore.exceptions import ClientError

        key = self.storage._normalize_name(name)
        extra: dict[str, Any] = {"IfNoneMatch": "*", "ContentType": "application/octet-stream"}
        if self.cache_control:
            extra["CacheControl"] = self.cache_control
        if self.retention_days:
            extra["ObjectLockMode"] = "COMPLIANCE"
            extra["ObjectLockRetainUntilDate"] = datetime.now(UTC) + timedelta(days=self.retention_days)
        client = self.storage.connection.meta.client
        with tempfile.SpooledTemporaryFile(max_size=8 << 20) as body:
            # A seekable body of known length: one PUT (S3 takes up to 5 GB so), retried safely.
            shutil.copyfileobj(source, body, 1 << 20)
            body.seek(0)
            try:
                client.put_object(Bucket=self.storage.bucket_name, Key=key, Body=body, **extra)
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status == 412 or exc.response.get("Error", {}).get("Code") == "PreconditionFailed":
                    raise FileExistsError(name) from exc
                raise

    def exists(self, name: str) -> bool:
        return bool(self.storage.exists(name))

    def open(self, name: str) -> IO[bytes]:
        return self.storage.open(name, "rb")


def get_storage() -> ExportStorage:
    config: dict[str, Any] = getattr(settings, "SAGAPLANE_EXPORT_STORAGE", {}) or {}
    backend = import_string(config.get("BACKEND", "transparency.storage.WriteOnceFileStorage"))
    return backend(**config.get("OPTIONS", {}))


def get_tile_storage() -> ExportStorage | None:
    """Where full tiles are published once each (a CDN can serve them from there), or None."""
    config: dict[str, Any] = getattr(settings, "SAGAPLANE_TILE_STORAGE", {}) or {}
    if not config.get("BACKEND"):
        return None
    return import_string(config["BACKEND"])(**config.get("OPTIONS", {}))


def publish_full_tile(tenant_slug: str, path: str, data: bytes) -> bool:
    """Put a full tile (or full entry bundle) into the tile store under `<tenant>/<path>`, once:
    the first read of each publishes it (the store refuses a second write; a cache key spares
    later reads the round trip). Best effort: a store that fails is logged and the tile is still
    served from the database. Returns whether this call published it."""
    from django.core.cache import cache

    store = get_tile_storage()
    if store is None:
        return False
    name = f"{tenant_slug}/{path}"
    marker = f"transparency:tile-published:{name}"
    try:
        if cache.get(marker):
            return False
        store.create(name, io.BytesIO(data))
        published = True
    except FileExistsError:
        published = False
    except Exception:
        log.warning("tile %s could not be published to the tile store", name, exc_info=True)
        return False
    try:
        cache.set(marker, 1, timeout=24 * 3600)
    except Exception:
        pass
    return published
