"""Reading WAL files (ours and agent-saga's): JSON lines, possibly with a torn tail, possibly in
segments (`segments.LogReader`: offsets are logical, a segmented WAL reads as one file)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ._files import atomic_write_json, meta_path, read_json
from .segments import LogReader, end_offsets


@dataclass(frozen=True)
class BadLine:
    """A newline-terminated line that is not a JSON object (never silently skipped)."""

    start: int
    end: int
    text: str

    def __str__(self) -> str:
        return f"unparseable line at byte {self.start}: {self.text[:60]!r}"


@dataclass(frozen=True)
class Entry:
    start: int  # byte offset of the line
    end: int  # byte offset just past its newline: a cursor after this record
    record: dict[str, Any] | None
    bad: BadLine | None = None


def iter_entries(
    path: str | os.PathLike[str], start: int = 0, *, limit: int | None = None, max_bytes: int | None = None
) -> Iterator[Entry]:
    """Yield complete lines from `start`. A final line with no newline is a write in
    progress (or torn by a crash) and is never yielded: it is not a record yet."""
    count = 0
    consumed = 0
    with LogReader(path, start) as fh:
        offset = fh.tell()  # past `start` when removal took the bytes there
        while limit is None or count < limit:
            line = fh.readline()
            if not line or not line.endswith(b"\n"):
                return
            end = offset + len(line)
            if max_bytes is not None and count and consumed + len(line) > max_bytes:
                return
            consumed += len(line)
            stripped = line.strip()
            if stripped:
                try:
                    obj = json.loads(stripped)
                except (ValueError, UnicodeDecodeError):
                    obj = None
                if isinstance(obj, dict):
                    yield Entry(offset, end, obj)
                else:
                    yield Entry(offset, end, None, BadLine(offset, end, stripped.decode("utf-8", "replace")))
                count += 1
            offset = end


def read_all(path: str | os.PathLike[str]) -> tuple[list[Entry], int]:
    """Every complete line plus the number of trailing bytes that form a torn last line."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    entries = list(iter_entries(path))
    complete, end = end_offsets(path)
    return entries, end - complete


def stream_id_for(
    wal_path: str | os.PathLike[str], explicit: str | None = None, *, create: bool = True
) -> str:
    """The stable stream id of the writer behind `wal_path`, kept in `<wal>.meta.json`.

    The id must outlive the process: a restarted agent continues the same chain, and
    the control plane keys the chain by stream.
    """
    mp = meta_path(wal_path)
    meta = read_json(mp) or {}
    current = meta.get("stream_id")
    if current and explicit and current != explicit:
        raise ValueError(
            f"{wal_path} belongs to stream {current!r} (see {mp}); refusing to relabel it {explicit!r}"
        )
    if current:
        return str(current)
    sid = explicit or f"st_{uuid.uuid4().hex}"
    if create:
        meta.update({"stream_id": sid, "format": "sagaplane-wal/1"})
        atomic_write_json(mp, meta)
    return sid
