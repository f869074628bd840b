"""The local write-ahead log: one hash-chained stream per writer, in agent-saga's format.

Every append is written to the file immediately (one write(2), so a SIGKILLed
process loses nothing the kernel already has); `sync()` adds the fsync that makes
records survive power loss. Many threads waiting for durability at once share
one fsync (leader/follower group commit): whoever finds no fsync in flight
becomes the leader and its fsync covers every record written before it began.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._files import fsync_dir, write_all
from .chain import GENESIS, HASH_FIELD, stamp
from .semantics import json_safe
from .walfile import stream_id_for

try:  # POSIX only; on other platforms the exclusive-writer check is skipped.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("sagaplane.wal")

MAX_TORN_BYTES = 1 << 20


class WALError(RuntimeError):
    """The WAL could not record something. Raised before the effect it was guarding."""


class WALLocked(WALError):
    """Another live process is writing this WAL; two writers would fork the chain."""


class WAL:
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        stream_id: str | None = None,
        fsync: bool = True,
        lock: bool = True,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync_enabled = fsync
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if lock and fcntl is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(self._fd)
                if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise WALLocked(f"{self.path} is already open for writing by another process") from exc
                raise
        fsync_dir(self.path.parent)
        try:
            self.stream_id = stream_id_for(self.path, stream_id)
            self._head, self._seq, self._size = self._recover_tail()
        except BaseException:
            os.close(self._fd)
            raise
        self._written = 0  # records appended by this process (a local counter for sync targets)
        self._durable = 0
        self._syncing = False
        self._closed = False
        self.fsyncs = 0
        self.sync_waits = 0
        self._listeners: list[Callable[[], None]] = []
        self._leases: dict[str, tuple[float, float]] = {}  # saga_id -> (ttl, last renewal)
        self._lease_thread: threading.Thread | None = None
        self._lease_wake = threading.Event()

    # -- opening -----------------------------------------------------------------------

    def _recover_tail(self) -> tuple[str, int, int]:
        """Find the last intact record; cut off a torn tail so the chain resumes from it.

        A crash mid-write leaves a partial last line. Appending after it would glue the
        next record onto the garbage and lose it (agent-saga does exactly that), so the
        partial bytes are moved to `<wal>.torn` and the file is truncated.
        """
        size = os.fstat(self._fd).st_size
        if size == 0:
            return GENESIS, 0, 0
        keep = size
        found: dict[str, Any] | None = None
        with open(self.path, "rb") as fh:
            for start, line in _reverse_lines(fh, size):
                if size - keep > MAX_TORN_BYTES:
                    break
                if not line.strip():
                    continue
                obj: Any = None
                if line.endswith(b"\n"):
                    try:
                        obj = json.loads(line)
                    except (ValueError, UnicodeDecodeError):
                        obj = None
                if isinstance(obj, dict):
                    found = obj
                    break
                keep = start
        torn = size - keep
        if torn:
            if torn > MAX_TORN_BYTES:
                raise WALError(f"{self.path}: {torn} unparseable bytes at the end; refusing to truncate")
            with open(self.path, "rb") as fh:
                fh.seek(keep)
                garbage = fh.read()
            with open(f"{self.path}.torn", "ab") as out:
                out.write(garbage if garbage.endswith(b"\n") else garbage + b"\n")
                out.flush()
                os.fsync(out.fileno())
            os.ftruncate(self._fd, keep)
            os.fsync(self._fd)
            logger.warning(
                "%s: truncated a torn tail of %d byte(s) (saved to %s.torn)", self.path, torn, self.path
            )
        if found is None:
            return GENESIS, 0, keep
        head = found.get(HASH_FIELD)
        if not isinstance(head, str):
            raise WALError(f"{self.path}: last record carries no hash; cannot continue its chain")
        seq = found.get("seq")
        return head, seq if isinstance(seq, int) else 0, keep

    # -- writing -----------------------------------------------------------------------

    @property
    def head(self) -> str:
        return self._head

    @property
    def seq(self) -> int:
        return self._seq

    def append(
        self, event: str, fields: dict[str, Any] | None = None, *, durable: bool = False
    ) -> dict[str, Any]:
        """Chain and write one record; with durable=True also wait for it to reach the disk."""
        record, mark = self.write(event, fields)
        if durable:
            self.sync(mark)
        return record

    def write(self, event: str, fields: dict[str, Any] | None = None) -> tuple[dict[str, Any], int]:
        """Chain and write one record without waiting for fsync; returns it and its sync mark."""
        safe = json_safe(fields or {})
        with self._lock:
            record, mark = self._write_locked(event, safe)
        self._notify()
        return record, mark

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # a broken observer must never fail the write it observes
                logger.exception("WAL listener failed")

    def _write_locked(self, event: str, safe: dict[str, Any]) -> tuple[dict[str, Any], int]:
        if self._closed:
            raise WALError(f"{self.path} is closed")
        record: dict[str, Any] = {"seq": self._seq + 1, "event": event, "ts": time.time()}
        record.update({k: v for k, v in safe.items() if k not in ("seq", "event", "ts")})
        head = stamp(record, self._head)
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        try:
            write_all(self._fd, line)
        except OSError as exc:
            # Put the file back to the last whole record so the chain on disk stays valid.
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                pass
            raise WALError(f"could not write {event} to {self.path}: {exc}") from exc
        self._size += len(line)
        self._seq += 1
        self._head = head
        self._written += 1
        return record, self._written

    def sync(self, upto: int | None = None) -> None:
        """Return once every record appended so far (or up to `upto`) is fsynced."""
        if not self.fsync_enabled:
            return
        with self._cond:
            target = self._written if upto is None else upto
            if self._durable >= target:
                return
            self.sync_waits += 1
            while self._durable < target:
                if self._syncing:
                    self._cond.wait()
                    continue
                self._syncing = True
                covered = self._written
                self._lock.release()
                err: OSError | None = None
                try:
                    os.fsync(self._fd)
                except OSError as exc:
                    err = exc
                finally:
                    self._lock.acquire()
                self._syncing = False
                if err is None:
                    self.fsyncs += 1
                    self._durable = max(self._durable, covered)
                self._cond.notify_all()
                if err is not None:
                    raise WALError(f"fsync of {self.path} failed: {err}") from err

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Called after every append (the shipper uses it to wake up instead of polling)."""
        self._listeners.append(listener)

    # -- leases ------------------------------------------------------------------------

    def hold_lease(self, saga_id: str, ttl: float) -> None:
        """Renew `saga_id`'s lease every ttl/3 with SAGA_LEASE until `release_lease`."""
        with self._lock:
            self._leases[saga_id] = (ttl, time.monotonic())
            if self._lease_thread is None:
                self._lease_thread = threading.Thread(
                    target=self._lease_loop, name="sagaplane-lease", daemon=True
                )
                self._lease_thread.start()
        self._lease_wake.set()

    def release_lease(self, saga_id: str) -> None:
        with self._lock:
            self._leases.pop(saga_id, None)

    def _lease_loop(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                renewed = False
                for sid, (ttl, last) in list(self._leases.items()):
                    if now - last >= ttl / 3:
                        # Written under the lock so a lease can never land after the saga's
                        # terminal record (release_lease takes the same lock).
                        try:
                            self._write_locked("SAGA_LEASE", {"saga_id": sid, "pid": os.getpid()})
                        except WALError:
                            return
                        self._leases[sid] = (ttl, now)
                        renewed = True
                waits = [ttl / 3 - (now - last) for ttl, last in self._leases.values()]
            if renewed:
                self._notify()
            self._lease_wake.wait(max(0.01, min(waits)) if waits else None)
            self._lease_wake.clear()

    # -- closing -----------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
        self.sync()
        with self._lock:
            self._closed = True
        self._lease_wake.set()
        if self._lease_thread is not None:
            self._lease_thread.join(timeout=5)
        os.close(self._fd)  # also releases the flock

    def __enter__(self) -> WAL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WAL({str(self.path)!r}, stream_id={self.stream_id!r}, seq={self._seq})"


def _reverse_lines(fh: Any, size: int, block: int = 65536) -> Any:
    """Yield (offset, line) from the end of the file backwards, reading one block at a time."""
    pos = size
    carry = b""
    while pos > 0:
        n = min(block, pos)
        pos -= n
        fh.seek(pos)
        buf = fh.read(n) + carry
        if pos > 0:
            first = buf.find(b"\n")
            if first < 0:
                carry = buf
                continue
            carry, region, base = buf[: first + 1], buf[first + 1 :], pos + first + 1
        else:
            carry, region, base = b"", buf, 0
        lines = region.splitlines(keepends=True)
        offsets = []
        off = base
        for line in lines:
            offsets.append(off)
            off += len(line)
        for off, line in zip(reversed(offsets), reversed(lines), strict=True):
            yield off, line
    if carry:
        yield 0, carry
