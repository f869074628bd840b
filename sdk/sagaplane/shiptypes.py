"""The shipper's vocabulary: batches (and reading one from a WAL), states, failures, backoff,
cursors and destinations."""

from __future__ import annotations

import enum
import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .client import AuthenticationError, Response
from .segments import LogReader
from .walfile import BadLine

# The control plane's default limits (SAGAPLANE_MAX_BATCH_RECORDS, SAGAPLANE_MAX_BODY_BYTES). A server
# configured lower answers 413 with its limit, and the shipper adopts it.
DEFAULT_BATCH = 5000
DEFAULT_BATCH_BYTES = 8 << 20  # of request body
_OPEN, _CLOSE = b'{"records":[', b"]}"
_READ_CHUNK = 1 << 20


@dataclass
class Batch:
    """Complete WAL lines from byte `start` to `end`, as the request body that carries them."""

    start: int
    end: int = 0  # just past the last line taken: the cursor once the batch is acknowledged
    lines: list[bytes] = field(default_factory=list)  # each a JSON object, exactly as on disk
    last: dict[str, Any] | None = None  # the last record, parsed (the cursor keeps its hash and seq)
    bad: BadLine | None = None  # the first line is not a JSON object: shipping cannot go past it

    @property
    def count(self) -> int:
        return len(self.lines)

    @property
    def body(self) -> bytes:
        # The lines are JSON objects already: no need to decode and re-encode a single record.
        return _OPEN + b",".join(self.lines) + _CLOSE

    @property
    def body_size(self) -> int:
        return len(_OPEN) + sum(map(len, self.lines)) + max(0, self.count - 1) + len(_CLOSE)


def read_batch(path: Path, start: int, batch_size: int, max_batch_bytes: int) -> Batch:
    """The complete lines from byte `start`: at most `batch_size` records in a body of at most
    `max_batch_bytes` (a single larger record goes alone; the server says if it is too big).
    Each line is checked to be a JSON object and sent as it is on disk. A line that is not ends
    the batch before it; if it is the first, `bad` says so (it is never skipped)."""
    batch = Batch(start, start)
    budget = max_batch_bytes - len(_OPEN) - len(_CLOSE)
    size = 0  # body bytes of the lines taken, commas included
    with LogReader(path, start) as fh:
        offset = fh.tell()  # logical offset of buf[0] (past `start` when removal took it)
        buf = b""
        while True:
            chunk = fh.read(_READ_CHUNK)
            if not chunk:
                return batch
            buf += chunk
            pos = 0
            while True:
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    break
                line = buf[pos:nl].strip()
                line_start, pos = offset + pos, nl + 1
                if not line:  # a blank line is no record (and passed with the records around it)
                    continue
                cost = len(line) + (1 if batch.count else 0)
                if batch.count and (batch.count >= batch_size or size + cost > budget):
                    return batch
                try:
                    record = json.loads(line.decode("utf-8"))
                except (ValueError, UnicodeDecodeError):
                    record = None
                if not isinstance(record, dict):
                    if not batch.count:
                        text = line.decode("utf-8", "replace")
                        batch.bad = BadLine(line_start, offset + pos, text)
                    return batch
                batch.lines.append(line)
                batch.last = record
                batch.end = offset + pos
                size += cost
            buf = buf[pos:]
            offset += pos
            if batch.count and (batch.count >= batch_size or size + len(buf) > budget):
                return batch  # the next line cannot fit (or the batch is full): stop reading


class ShipperState(str, enum.Enum):  # noqa: UP042
    IDLE = "idle"  # caught up, waiting for new records
    SHIPPING = "shipping"
    BACKOFF = "backoff"  # the control plane is unreachable or unhappy; retrying
    FAILED = "failed"  # stopped: the server refused the records or the key
    CLOSED = "closed"


class ShipFailed(Exception):
    """Shipping stopped and will not resume by itself."""

    def __init__(self, reason: str, status: int | None = None, body: Any = None) -> None:
        self.reason = reason
        self.status = status
        self.body = body
        super().__init__(reason)


class ShipAuthFailed(ShipFailed, AuthenticationError):
    """Shipping stopped because the control plane refused the API key (401) or its scope (403).

    Both a ShipFailed (the shipper stopped) and the SDK's AuthenticationError (what to fix)."""

    status: int  # always an HTTP status here (a ShipFailed in general may have none)

    def __init__(self, status: int, code: str, detail: str = "", body: Any = None) -> None:
        self.status = status
        self.code = code
        self.body = body
        what = "rejected" if status == 401 else "not allowed to ship records (scope)"
        self.reason = f"API key refused by the control plane: {what}, HTTP {status} {code}" + (
            f": {detail}" if detail else ""
        )
        Exception.__init__(self, self.reason)


class RetryLater(Exception):
    def __init__(self, reason: str, retry_after: float | None = None, *, immediate: bool = False) -> None:
        self.reason = reason
        self.retry_after = retry_after
        self.immediate = immediate  # e.g. after shrinking a batch that got 413: no reason to wait
        super().__init__(reason)


@dataclass
class Backoff:
    """Exponential backoff with full jitter (delay uniform in [0, min(cap, base * 2**n)])."""

    base: float = 0.5
    cap: float = 60.0
    rng: Callable[[], float] = field(default=random.random)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        ceiling = min(self.cap, self.base * (2 ** min(attempt, 30)))
        d = self.rng() * ceiling
        if retry_after is not None:
            d = max(d, min(retry_after, self.cap))
        return d


@dataclass
class Cursor:
    stream: str
    offset: int = 0
    hash: str | None = None
    seq: Any = None
    shipped: int = 0  # records acknowledged through this cursor (accepted + duplicates)


_SAGAPLANE_KEY = re.compile(r"(sp_[a-z0-9]{12})_")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
# Refusals of a batch's first record that mean "this is not where the stream ends".
_OFF_HEAD = frozenset({"broken_link", "seq_gap", "seq_regression"})


def key_identity(api_key: str) -> str:
    """Which API key (and so which tenant) a cursor belongs to, never the secret: the public
    `sp_<prefix>` of a Sagaplane key (what the dashboard lists), else a truncated SHA-256
    fingerprint of the key."""
    match = _SAGAPLANE_KEY.match(api_key)
    if match is not None:
        return match.group(1)
    return "sha256:" + hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:16]


def destination_id(url: str, api_key: str, stream_id: str) -> str:
    """A short, filename-safe name for (control plane URL, key identity, stream)."""
    text = "\n".join((url.rstrip("/"), key_identity(api_key), stream_id))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _retry_after(response: Response) -> float | None:
    for key, value in response.headers.items():
        if key.lower() == "retry-after":
            try:
                return max(0.0, float(value))
            except ValueError:
                return None
    return None
