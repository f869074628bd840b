"""Shipping a WAL to the control plane: tail the file, POST batches, remember how far we got.

The cursor (byte offset + the last acknowledged `_h`) lives in `<wal>.cursor-<destination>.json`,
one per destination (control plane URL, API key identity, stream: `destination_id`), and is
replaced atomically after every acknowledged batch. A crash between the server's answer and the
cursor write just re-sends one batch, which the server counts as duplicates. Memory stays
bounded: at most one batch is read from disk.

The server, not the cursor, says where shipping resumes. Before the first batch the shipper asks
for the stream's head (`GET /api/v1/streams/<id>`) and resumes just after the WAL record with
that hash: from the start when the server holds nothing (a fresh control plane), earlier than
the cursor when the server lost records (a restore from backup), later when another shipper got
further. A head that is not in the WAL stops shipping with an error naming it; nothing is skipped
on a guess. A batch refused because its first record does not link to the head (the server
changed under a running shipper) triggers the same reconciliation once.

Transient trouble (connection errors, 5xx, 429) is retried with exponential
backoff and full jitter, forever in the background thread, since records wait
safely on disk. A 4xx about the chain (422 chain_broken, 409 equivocation),
a malformed batch (400) or a refused key (401/403) stops shipping loudly: the
state becomes `failed`, the reason is logged at ERROR, and nothing is dropped
or rewritten -- a human has to look.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from . import tracing
from ._files import atomic_write_json, cursor_path, read_json
from .chain import GENESIS, HASH_FIELD
from .client import Client, PendingRequest, Response, TransportError
from .segments import LogReader, complete_end, load_manifest
from .shiptypes import (
    _HEX64,
    _OFF_HEAD,
    DEFAULT_BATCH,
    DEFAULT_BATCH_BYTES,
    Backoff,
    Batch,
    Cursor,
    RetryLater,
    ShipAuthFailed,
    ShipFailed,
    ShipperState,
    _retry_after,
    destination_id,
    key_identity,
    read_batch,
)
from .walfile import stream_id_for

logger = logging.getLogger("sagaplane.shipper")

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_BATCH_BYTES",
    "Backoff",
    "Batch",
    "Cursor",
    "RetryLater",
    "ShipAuthFailed",
    "ShipFailed",
    "Shipper",
    "ShipperState",
    "destination_id",
    "key_identity",
]


class Shipper:
    def __init__(
        self,
        wal_path: str | os.PathLike[str],
        *,
        stream_id: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        client: Client | None = None,
        batch_size: int = DEFAULT_BATCH,
        max_batch_bytes: int = DEFAULT_BATCH_BYTES,
        backoff: Backoff | None = None,
        poll_interval: float = 1.0,
        on_batch: Callable[[int, Response], None] | None = None,
        pipeline: bool = True,
    ) -> None:
        self.path = Path(wal_path)
        self.client = client or Client(url, api_key)
        self.stream_id = stream_id_for(self.path, stream_id)
        self.batch_size = max(1, batch_size)
        self.max_batch_bytes = max(1, max_batch_bytes)
        self.pipeline = pipeline  # read the next batch while the server handles this one
        self._next: Batch | None = None
        self.backoff = backoff or Backoff()
        self.poll_interval = poll_interval
        self.on_batch = on_batch
        self.destination = {
            "url": self.client.url,
            "key": key_identity(self.client.api_key),
            "stream": self.stream_id,
        }
        self.cursor_file = cursor_path(
            self.path, destination_id(self.client.url, self.client.api_key, self.stream_id)
        )
        self.reconciled = False  # the cursor has been checked against the server's head
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.state = ShipperState.IDLE
        self.failure: ShipFailed | None = None
        self.attempt = 0  # consecutive transient failures
        self.retries = 0  # total transient failures
        self.delays: list[float] = []  # backoff delays actually waited (for tests and metrics)
        self.accepted = 0
        self.duplicates = 0
        self.last_response: Response | None = None
        self.last_traceparent = ""  # the W3C trace context the last batch was sent with
        self.cursor = self._load_cursor()
        self._ack_listeners: list[Callable[[int], object]] = []

    def on_acknowledged(self, listener: Callable[[int], object]) -> None:
        """Call `listener(offset)` once the control plane has acknowledged every record before the
        logical `offset` (its verified cursor). `WAL.attach` subscribes the WAL's compaction."""
        self._ack_listeners.append(listener)

    # -- cursor ------------------------------------------------------------------------

    def _load_cursor(self) -> Cursor:
        """This destination's cursor, as a first guess: `_reconcile` checks it against the server
        before the first batch is sent."""
        data = read_json(self.cursor_file)
        if not isinstance(data, dict) or data.get("stream") != self.stream_id:
            return Cursor(self.stream_id)
        offset, shipped = data.get("offset"), data.get("shipped")
        return Cursor(
            self.stream_id,
            offset if type(offset) is int and offset >= 0 else 0,
            data.get("hash"),
            data.get("seq"),
            shipped if type(shipped) is int else 0,
        )

    def _cursor_points_at(self, cursor: Cursor, head: str) -> bool:
        """Is the record just before the cursor's offset the one hashed `head`? (Cheap: reads at
        most the last MiB before the offset, instead of scanning the WAL.)"""
        if cursor.hash != head or cursor.offset <= 0:
            return False
        try:
            with LogReader(self.path, max(0, cursor.offset - (1 << 20))) as fh:
                start = fh.tell()
                if start >= cursor.offset:
                    return False
                chunk = b""
                while len(chunk) < cursor.offset - start:
                    more = fh.read(cursor.offset - start - len(chunk))
                    if not more:
                        return False  # the WAL ends before the cursor
                    chunk += more
        except FileNotFoundError:
            return False
        if not chunk.endswith(b"\n"):
            return False
        line = chunk.rstrip(b"\n").rsplit(b"\n", 1)[-1]
        try:
            last = json.loads(line)
        except ValueError:
            return False
        return isinstance(last, dict) and last.get(HASH_FIELD) == head

    def _find_record(self, head: str) -> tuple[int, Any] | None:
        """(byte offset just past the WAL record hashed `head`, its seq), scanning the file one
        line at a time (memory bounded by the longest line)."""
        needle = head.encode("ascii")
        trimmed = _trimmed(self.path)
        if trimmed is not None and trimmed.get("hash") == head:
            return trimmed["end"], trimmed.get("seq")  # the last record removal took
        try:
            with LogReader(self.path) as fh:
                offset = fh.tell()
                for line in iter(fh.readline, b""):
                    offset += len(line)
                    if needle not in line or not line.endswith(b"\n"):
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(record, dict) and record.get(HASH_FIELD) == head:
                        return offset, record.get("seq")
        except FileNotFoundError:
            return None
        return None

    def _reconcile(self, head_hint: str | None = None) -> bool:
        """Set the cursor to where the server's copy of the stream ends. Returns True when it moved.

        The head comes from `GET /api/v1/streams/<id>` (404: the server holds nothing), or, for a
        key without the `read` scope, from `head_hint` (what a refusal named as the head) and
        otherwise the cursor is kept as it is. Raises RetryLater for transient trouble, ShipFailed
        when the head is not in this WAL."""
        response = self._get_stream_head()
        if response is None:
            if head_hint is None:
                self.reconciled = True
                return False
            head: str | None = head_hint
            seq: Any = None
        else:
            head, seq = response
        if head is None or head == GENESIS:
            target = Cursor(self.stream_id)
            if self.cursor.offset:
                logger.warning(
                    "sagaplane shipper: %s holds nothing of stream %s; shipping %s from the start "
                    "(the cursor said byte %d)",
                    self.client.url,
                    self.stream_id,
                    self.path,
                    self.cursor.offset,
                )
        elif self._cursor_points_at(self.cursor, head):
            target = self.cursor
        else:
            found = self._find_record(head)
            if found is None:
                raise ShipFailed(
                    f"the control plane's stream {self.stream_id} ends at record {head}"
                    + (f" (seq {seq})" if seq is not None else "")
                    + f", which is not in {self.path}: this is not the WAL that stream was shipped "
                    "from, or the WAL was rewritten; refusing to guess where to resume"
                )
            offset, found_seq = found
            target = Cursor(self.stream_id, offset, head, found_seq, self.cursor.shipped)
            if offset != self.cursor.offset:
                logger.warning(
                    "sagaplane shipper: %s holds stream %s up to seq %s; resuming %s at byte %d "
                    "(the cursor said byte %d)",
                    self.client.url,
                    self.stream_id,
                    found_seq,
                    self.path,
                    offset,
                    self.cursor.offset,
                )
        moved = target.offset != self.cursor.offset
        with self._cond:
            self.cursor = target
            self._next = None
            self._save_cursor()
            self.reconciled = True
            self._cond.notify_all()
        return moved

    def _get_stream_head(self) -> tuple[str | None, Any] | None:
        """(head hash, head seq) as the server holds the stream ((None, None): nothing), or None
        when this key may not read it."""
        try:
            response = self.client.stream(self.stream_id)
        except TransportError as exc:
            raise RetryLater(str(exc)) from exc
        status = response.status
        body = response.body if isinstance(response.body, dict) else {}
        if status == 404:
            return None, None
        if response.ok:
            held = body.get("head")
            head: dict[str, Any] = held if isinstance(held, dict) else {}
            hash_ = head.get("hash")
            if hash_ is not None and not (isinstance(hash_, str) and _HEX64.match(hash_)):
                raise ShipFailed(f"the control plane answered an unreadable stream head: {response.body}")
            return hash_, head.get("seq")
        if status == 403:
            logger.warning(
                "sagaplane shipper: this API key may not read stream %s (HTTP 403 %s); trusting the "
                "local cursor until the server refuses a batch. Give the key the 'read' scope so "
                "shipping can always resume where the server is.",
                self.stream_id,
                response.error_code,
            )
            return None
        if status == 401:
            raise ShipAuthFailed(status, response.error_code or "error", str(body.get("detail") or ""), body)
        if status == 429 or status >= 500:
            raise RetryLater(f"HTTP {status} {response.error_code}".strip(), _retry_after(response))
        raise ShipFailed(f"cannot read stream {self.stream_id}: HTTP {status} {response.body}", status, body)

    def _save_cursor(self) -> None:
        c = self.cursor
        atomic_write_json(
            self.cursor_file,
            {
                **self.destination,
                "offset": c.offset,
                "hash": c.hash,
                "seq": c.seq,
                "shipped": c.shipped,
            },
        )

    # -- one batch ---------------------------------------------------------------------

    def _read_batch(self, start: int) -> Batch:
        return read_batch(self.path, start, self.batch_size, self.max_batch_bytes)

    def _next_batch(self) -> Batch:
        pre, self._next = self._next, None
        if pre is not None and pre.start == self.cursor.offset and pre.count <= self.batch_size:
            return pre
        return self._read_batch(self.cursor.offset)

    def ship_once(self) -> int:
        """Send the next batch. Returns the number of records acknowledged (0 when caught up).

        Raises RetryLater for transient trouble and ShipFailed when shipping must stop.
        """
        if self.failure is not None:
            raise self.failure
        if not self.reconciled:
            self._reconcile()
        batch = self._next_batch()
        if batch.bad is not None:
            raise ShipFailed(f"{self.path}: {batch.bad}; refusing to skip it")
        if not batch.count:
            return 0
        # Each batch carries a W3C traceparent (its own span when the agent uses OpenTelemetry), so
        # the control plane's logs and traces of it share the agent's trace id.
        span = tracing.start_batch(self.stream_id, batch.lines)
        self.last_traceparent = span.traceparent
        try:
            pending: PendingRequest = self.client.start_records_raw(
                self.stream_id, batch.body, headers=span.headers
            )
        except BaseException:
            span.end(None, "not sent")
            raise
        if self.pipeline:
            # While the server verifies and stores this batch, read the one after it. It is used
            # only if this one is acknowledged (then the cursor is exactly where it starts).
            upcoming = self._read_batch(batch.end)
            self._next = upcoming if upcoming.count or upcoming.bad else None
        try:
            response = pending.response()
        except TransportError as exc:
            self._next = None
            span.end(None, str(exc))
            raise RetryLater(str(exc)) from exc
        span.end(response.status)
        self.last_response = response
        if not response.ok:
            self._next = None
            self._refused(batch, response)
        self._acknowledged(batch, response)
        return batch.count

    def _acknowledged(self, batch: Batch, response: Response) -> None:
        """The batch is stored: move the cursor past it and tell who listens."""
        body = response.body if isinstance(response.body, dict) else {}
        self.accepted += int(body.get("accepted", 0) or 0)
        self.duplicates += int(body.get("duplicates", 0) or 0)
        last = batch.last or {}
        with self._cond:
            self.cursor.offset = batch.end
            self.cursor.hash = last.get(HASH_FIELD)
            self.cursor.seq = last.get("seq")
            self.cursor.shipped += batch.count
            self._save_cursor()
            self._cond.notify_all()
        for listener in list(self._ack_listeners):
            try:  # e.g. WAL.acknowledge: what the control plane holds may leave
                listener(batch.end)
            except Exception:  # housekeeping never stops shipping
                logger.exception("sagaplane shipper: an acknowledgement listener failed")
        if self.on_batch is not None:
            self.on_batch(batch.count, response)

    def _refused(self, batch: Batch, response: Response) -> NoReturn:
        """The batch was not stored: RetryLater when sending again may succeed, else ShipFailed."""
        status = response.status
        if status == 413:
            self._shrink(batch, response)
            raise RetryLater(
                f"413: batch of {batch.count} too large; now at most {self.batch_size} "
                f"records, {self.max_batch_bytes} bytes",
                immediate=True,
            )
        if status == 429 or status >= 500:
            raise RetryLater(f"HTTP {status} {response.error_code}".strip(), _retry_after(response))
        code = response.error_code or "error"
        body = response.body if isinstance(response.body, dict) else {}
        if status in (401, 403):
            raise ShipAuthFailed(status, code, str(body.get("detail") or ""), response.body)
        if status == 422 and body.get("index") == 0 and body.get("reason") in _OFF_HEAD:
            # The batch does not start at the server's head: the server changed under us (restored
            # from a backup, say). Resume where it is, once; a second refusal here is a real break.
            hint = body.get("expected") if body.get("reason") == "broken_link" else None
            if self._reconcile(hint if isinstance(hint, str) and _HEX64.match(hint) else None):
                raise RetryLater(
                    f"the stream head moved; resending from byte {self.cursor.offset}", immediate=True
                )
        if code == "chain_broken" or status == 422:
            raise ShipFailed(
                f"control plane rejected the chain at seq={body.get('seq')} index={body.get('index')} "
                f"(batch offset {batch.start}): {body.get('reason', code)}",
                status,
                response.body,
            )
        if code == "equivocation" or status == 409:
            raise ShipFailed(
                f"control plane reports equivocation on stream {self.stream_id}: {response.body}",
                status,
                response.body,
            )
        raise ShipFailed(
            f"control plane refused the batch: HTTP {status} {response.body}", status, response.body
        )

    def _shrink(self, batch: Batch, response: Response) -> None:
        """After a 413: adopt the limit the server names (records or body bytes), else halve."""
        if batch.count <= 1:
            raise ShipFailed(
                "a single record is larger than the control plane accepts (413)", 413, response.body
            )
        body = response.body if isinstance(response.body, dict) else {}
        limit = body.get("limit")
        limit = limit if type(limit) is int and limit > 0 else None
        code = response.error_code
        if code == "too_many_records" and limit is not None and limit < batch.count:
            self.batch_size = limit
        elif code == "too_large" and limit is not None and limit < batch.body_size:
            self.max_batch_bytes = limit
        else:  # no usable limit (a proxy's 413, say): halve the batch (its bytes halve with it)
            self.batch_size = max(1, batch.count // 2)

    # -- failure and retry ---------------------------------------------------------------

    def _fail(self, failure: ShipFailed) -> None:
        # Log before publishing the state, so anyone woken by `failed` already sees the reason logged.
        logger.error(
            "sagaplane shipper STOPPED for %s (stream %s): %s. Records stay on disk; fix the cause "
            "and restart shipping.",
            self.path,
            self.stream_id,
            failure.reason,
        )
        with self._cond:
            self.failure = failure
            self.state = ShipperState.FAILED
            self._cond.notify_all()

    def _wait_backoff(self, exc: RetryLater) -> bool:
        """Wait before the next attempt. Returns False when closing."""
        if exc.immediate:
            return not self._stop
        delay = self.backoff.delay(self.attempt, exc.retry_after)
        self.attempt += 1
        self.retries += 1
        self.delays.append(delay)
        with self._cond:
            self.state = ShipperState.BACKOFF
            self._cond.notify_all()
        logger.warning("sagaplane shipper: %s; retrying in %.2fs", exc.reason, delay)
        deadline = time.monotonic() + delay
        # Only close() cuts a backoff short; new records or flush() calls do not.
        while not self._stop:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._wake.wait(remaining)
            self._wake.clear()
        return not self._stop

    def run_until_caught_up(self, *, max_retries: int | None = None) -> int:
        """Foreground shipping (the CLI): ship until the end of the file. Returns records shipped."""
        total = 0
        while True:
            try:
                n = self.ship_once()
            except RetryLater as exc:
                if max_retries is not None and self.attempt >= max_retries:
                    raise ShipFailed(f"giving up after {self.attempt} retries: {exc.reason}") from exc
                if not self._wait_backoff(exc):
                    return total
                continue
            except ShipFailed as exc:
                self._fail(exc)
                raise
            self.attempt = 0
            if n == 0:
                return total
            total += n

    # -- background thread -----------------------------------------------------------------

    def start(self) -> Shipper:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"sagaplane-shipper-{self.stream_id}", daemon=True
            )
            self._thread.start()
        return self

    def notify(self) -> None:
        """New records were appended; ship them without waiting for the poll interval."""
        if self.state is not ShipperState.BACKOFF:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            if self.failure is not None:
                self._wake.wait()
                self._wake.clear()
                continue
            with self._cond:
                self.state = ShipperState.SHIPPING
            try:
                n = self.ship_once()
            except RetryLater as exc:
                self._wait_backoff(exc)
                continue
            except ShipFailed as exc:
                self._fail(exc)
                continue
            except Exception as exc:  # never let the thread die silently
                self._fail(ShipFailed(f"unexpected shipper error: {exc!r}"))
                continue
            self.attempt = 0
            if n == 0:
                with self._cond:
                    self.state = ShipperState.IDLE
                    self._cond.notify_all()
                self._wake.wait(self.poll_interval)
                self._wake.clear()
        self.client.close()  # this thread's kept-alive connection
        with self._cond:
            self.state = ShipperState.CLOSED
            self._cond.notify_all()

    def pending_bytes(self) -> int:
        return max(0, _complete_size(self.path) - self.cursor.offset)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything written to the WAL so far is acknowledged. False on timeout or failure."""
        target = _complete_size(self.path)
        if self._thread is None:
            self.start()
        self._wake.set()
        with self._cond:
            # Until reconciled, the cursor is only what this machine remembers, not what the server holds.
            done = self._cond.wait_for(
                lambda: (
                    (self.reconciled and self.cursor.offset >= target)
                    or self.failure is not None
                    or self.state is ShipperState.CLOSED
                ),
                timeout,
            )
            return bool(done) and self.reconciled and self.cursor.offset >= target

    def close(self, timeout: float | None = 10.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.client.close()
        with self._cond:
            self.state = ShipperState.CLOSED
            self._cond.notify_all()

    def __enter__(self) -> Shipper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _complete_size(path: Path) -> int:
    """The logical end of the WAL's complete lines: a partial last line is not a record yet."""
    return complete_end(path)


def _trimmed(path: Path) -> dict[str, Any] | None:
    manifest = load_manifest(path)
    return None if manifest is None else manifest.trimmed
