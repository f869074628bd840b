"""Small durable-file helpers shared by the WAL, the shipper cursor and the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Replace `path` with `obj` so a crash leaves either the old or the new file, never half of one."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    data = (json.dumps(obj, sort_keys=True, indent=1) + "\n").encode("utf-8")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    fsync_dir(target.parent)


def read_json(path: str | os.PathLike[str]) -> Any | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    # Without this a rename can be lost on power failure even though the file data is durable.
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def meta_path(wal_path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(wal_path)}.meta.json")


def cursor_path(wal_path: str | os.PathLike[str], destination: str) -> Path:
    """The shipping cursor of `wal_path` for one destination (see `shipper.destination_id`): a WAL
    shipped to two control planes, tenants or streams keeps one cursor for each."""
    return Path(f"{os.fspath(wal_path)}.cursor-{destination}.json")
