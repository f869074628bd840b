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

import os
import shutil
import uuid
from pathlib import Path
from typing import IO, Any, Protocol

from django.conf import settings
from django.utils.module_loading import import_string


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


def get_storage() -> ExportStorage:
    config: dict[str, Any] = getattr(settings, "SAGAPLANE_EXPORT_STORAGE", {}) or {}
    backend = import_string(config.get("BACKEND", "transparency.storage.WriteOnceFileStorage"))
    return backend(**config.get("OPTIONS", {}))
