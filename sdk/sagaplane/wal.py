"""The local write-ahead log: one hash-chained stream per writer, in agent-saga's format.

Three levels of "written", and which records get which:

- **buffered**: accepted and queued in memory, fields already encoded; seq and hash are
  assigned in order when the queue is written. Records no effect depends on durably --
  SAGA_START, a step's outcome (of a REVERSIBLE or COMPENSABLE step), rollback records --
  wait here and reach the file with the next write-through, `sync()`, `close()`,
  interpreter exit, or after `flush_interval` (5 ms) at the latest, whichever comes first.
  Every intent is written through before its effect (`write_through_intents`, on by default),
  so a SIGKILL never hides an effect that happened: at worst an outcome from the last few
  milliseconds is missing, and the step reads as 'unknown', which recovery resolves. A clean
  exit loses nothing. `write_through_intents=False` queues REVERSIBLE intents too, as
  agent-saga's fast path does, for agents that accept that window. The shipper reads the
  file, so it only ever sees whole records in chain order.
- **written**: in the file, one write(2) carrying everything queued before it, in order.
  `append()` and the terminal record of a saga write through.
- **durable**: fsynced (`fdatasync(2)` where the platform has it: the WAL only appends, and
  fdatasync flushes the data and the file size, everything a reader needs; only timestamps
  are left to the next journal commit). Before a COMPENSABLE or IRREVERSIBLE effect its intent
  is durable.
  Waiters share fsyncs (group commit): a thread that finds no fsync in flight leads one that
  covers every record written before it began; asyncio waiters hand their futures to the
  WAL's flusher thread, which runs the same rounds, so threads and tasks share fsyncs.
  `sync_soon()` asks for durability within `durable_delay` without waiting for it (a
  COMPENSABLE step's outcome: the next barrier usually covers it first).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._files import fsync_dir, write_all
from .chain import (
    DIGEST_FIELD,
    HASH_FIELD,
    PREV_FIELD,
    SALT_FIELD,
    canonical,
    record_hash_fast,
    token_hex,
)
from .events import Event
from .segments import lock_file, recover
from .walfile import stream_id_for
from .wallife import SegmentedLog
from .walrecord import ENV_AGENT, WALError, WALLocked, check_agent_name, encode_business

logger = logging.getLogger("sagaplane.wal")

FLUSH_INTERVAL = 0.005  # a buffered record reaches the file within this (plus scheduling)
# An append's durability: data and size (fdatasync), not mtime; fsync where there is no fdatasync.
_sync_data: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)
DURABLE_DELAY = 0.02  # sync_soon(): fsynced within this unless a barrier covers it first
# After a sync_soon the flusher wakes every DURABLE_DELAY for this long instead of being notified
# by each one; then, idle, it sleeps until notified.
LINGER_S = 1.0
MAX_BUFFERED = 512  # records; more are written through at once (bounded memory)
MAX_BUFFERED_BYTES = 1 << 20
# Roll-over (ARCHITECTURE §3, "The WAL's life"): the live segment is sealed past this size or age.
SEGMENT_BYTES = 4 << 20
SEGMENT_AGE_S = 3600.0
_ENCODED_EVENTS: dict[str, str] = {}

# A record queued by `emit(buffered=True)`, not yet chained: (event, ts, canonical business fields).
Pending = tuple[str, float, bytes]
_sha256 = __import__("hashlib").sha256
_encode_business = encode_business

__all__ = ["ENV_AGENT", "SEGMENT_AGE_S", "SEGMENT_BYTES", "WAL", "WALError", "WALLocked", "check_agent_name"]


_open_wals: weakref.WeakSet[WAL] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    """A clean interpreter exit never drops buffered records, even from a WAL nobody closed."""
    for wal in list(_open_wals):
        if wal._pid != os.getpid():  # a forked child must not write its parent's buffer twice
            continue
        try:
            wal.sync()
        except Exception:
            logger.exception("%s: could not flush the WAL at exit", wal.path)


class WAL(SegmentedLog):
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        stream_id: str | None = None,
        fsync: bool = True,
        lock: bool = True,
        flush_interval: float = FLUSH_INTERVAL,
        durable_delay: float = DURABLE_DELAY,
        write_through_intents: bool = True,
        agent: str | None = None,
        segment_bytes: int = SEGMENT_BYTES,
        segment_age_s: float = SEGMENT_AGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # Checked before the file is opened: a bad name must not leave a WAL half set up.
        self.agent = check_agent_name(agent)
        if segment_bytes < 1 or segment_age_s <= 0:
            raise ValueError("segment_bytes and segment_age_s must be positive")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync_enabled = fsync
        self.flush_interval = flush_interval
        self.durable_delay = durable_delay
        # True: a REVERSIBLE step's intent is also in the file before its effect (one write(2)
        # per step), so even a SIGKILL cannot lose it. COMPENSABLE/IRREVERSIBLE always are.
        self.write_through_intents = write_through_intents
        self.segment_bytes = segment_bytes
        self.segment_age_s = segment_age_s
        self._clock = clock  # records' ts, segment age and lease lapse (tests drive it)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # threads waiting for an fsync round
        self._flusher_cond = threading.Condition(self._lock)  # the flusher thread
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if lock:
                lock_file(fd, self.path)
            fsync_dir(self.path.parent)
            self.stream_id = stream_id_for(self.path, stream_id)
            fd, manifest = recover(self.path, fd)
            self._fd = fd
            self._open_segments(manifest)
        except BlockingIOError as exc:
            os.close(fd)
            raise WALLocked(str(exc)) from exc
        except BaseException:
            os.close(fd)
            raise
        self._pid = os.getpid()
        # Marks count records chained by this process: appended >= flushed >= durable.
        self._appended = 0
        self._flushed = 0  # in the file
        self._durable = 0  # fsynced
        self._buf: list[Pending] = []
        self._buf_bytes = 0
        self._buf_since = 0.0
        self._syncing = False
        self._closed = False
        self._async_waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._lazy_target = 0
        self._lazy_deadline = 0.0
        self._lazy_recent_until = 0.0  # monotonic time until which the flusher lingers
        self._flusher: threading.Thread | None = None
        self._flusher_wake_at = float("inf")
        self.fsyncs = 0
        self.sync_waits = 0
        self.writes = 0  # write(2) batches
        self._listeners: list[Callable[[], None]] = []
        self._leases: dict[str, tuple[float, float]] = {}  # saga_id -> (ttl, last renewal)
        self._lease_thread: threading.Thread | None = None
        self._lease_wake = threading.Event()
        self._init_life()
        _open_wals.add(self)

    # -- writing -----------------------------------------------------------------------

    @property
    def head(self) -> str:
        """The hash of the last record (buffered records are written first, so it is final)."""
        self.flush()
        return self._head

    @property
    def seq(self) -> int:
        return self._seq + len(self._buf)

    @property
    def buffered(self) -> int:
        """Records accepted but not yet in the file."""
        return len(self._buf)

    def append(
        self, event: str, fields: dict[str, Any] | None = None, *, durable: bool = False
    ) -> dict[str, Any]:
        """Chain and write one record (write-through); with durable=True also wait for the fsync."""
        record, mark = self.write(event, fields)
        if durable:
            self.sync(mark)
        return record

    def write(self, event: str, fields: dict[str, Any] | None = None) -> tuple[dict[str, Any], int]:
        """Chain and write one record (with everything buffered before it) without waiting for
        fsync; returns the record as a reader will parse it from the file, and its sync mark."""
        business = _encode_business(fields or {})
        with self._lock:
            if self._closed:
                raise WALError(f"{self.path} is closed")
            ts = self._clock()
            if fields and "saga_id" in fields:  # noted at the segment it is written to, before a roll-over
                self._sagas.note(event, fields["saga_id"], self._base, ts, fields.get("lease_ttl"))
            line = self._write_out_locked((event, ts, business))
            mark = self._appended
        self._notify()
        return json.loads(line), mark

    def emit(self, event: str, fields: dict[str, Any], *, buffered: bool = False) -> int:
        """Record `event`; returns its sync mark. The saga engine's hot path.

        buffered=False writes it (and everything buffered before it) to the file now.
        buffered=True queues it: its fields are encoded now (later changes to them cannot
        alter the record), its seq and hash are assigned in order when the queue is written."""
        business = _encode_business(fields)
        wrote = False
        with self._lock:
            if self._closed:
                raise WALError(f"{self.path} is closed")
            ts = self._clock()
            item = (event, ts, business)
            saga_id = fields.get("saga_id")
            if saga_id is not None:  # what compaction must keep (walcompact.OpenSagas)
                self._sagas.note(event, saga_id, self._base, ts, fields.get("lease_ttl"))
            if buffered and len(self._buf) < MAX_BUFFERED and self._buf_bytes < MAX_BUFFERED_BYTES:
                if not self._buf:
                    self._buf_since = time.monotonic()
                    self._wake_flusher_locked(self._buf_since + self.flush_interval)
                self._buf.append(item)
                self._buf_bytes += len(business)
                self._appended += 1
            else:
                self._write_out_locked(item)
                wrote = True
            mark = self._appended
        if wrote and self._listeners:
            self._notify()
        return mark

    def _stamp_locked(self, event: str, ts: float, business: bytes) -> bytes:
        """Chain one record onto the head and return its line.

        Business fields were encoded once: the canonical bytes are hashed for the content
        digest and spliced into the line as they are, so what a verifier re-canonicalises
        from the parsed line is exactly what was hashed. Same fields, same chain as
        `chain.stamp`; only the line's key order and spacing differ (JSON does not care)."""
        seq = self._seq + 1
        salt = token_hex()
        digest = _sha256(salt.encode("ascii") + business).hexdigest()
        prev = self._head
        head = record_hash_fast(prev, seq, ts, event, digest)
        ev = _ENCODED_EVENTS.get(event)
        if ev is None:
            ev = canonical(event).decode("utf-8")
            if len(_ENCODED_EVENTS) < 256:
                _ENCODED_EVENTS[event] = ev
        inner = business[1:-1]
        self._seq = seq
        self._head = head
        return b"".join(
            (
                f'{{"seq":{seq},"event":{ev},"ts":{float.__repr__(ts)},'.encode(),
                inner,
                b"," if inner else b"",
                f'"{SALT_FIELD}":"{salt}","{DIGEST_FIELD}":"{digest}",'
                f'"{PREV_FIELD}":{canonical(prev).decode("utf-8")},"{HASH_FIELD}":"{head}"}}\n'.encode(),
            )
        )

    def _write_out_locked(self, extra: Pending | None = None) -> bytes:
        """Chain and write the buffer (and `extra`) in one write. Returns the last line written.

        On failure the file is put back to its last whole record, the chain head and seq are
        restored, the buffer is kept for the next attempt, and WALError is raised."""
        if not self._buf and extra is None:
            return b""
        seq, head = self._seq, self._head
        items = [*self._buf, extra] if extra is not None else self._buf
        lines = [self._stamp_locked(*item) for item in items]
        data = b"".join(lines)
        try:
            write_all(self._fd, data)
        except OSError as exc:
            self._seq, self._head = seq, head
            # Put the file back to the last whole record so the chain on disk stays valid.
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                pass
            raise WALError(f"could not write to {self.path}: {exc}") from exc
        if not self._size:
            self._live_since = self._clock()
        self._size += len(data)
        self.writes += 1
        self._buf = []
        self._buf_bytes = 0
        if extra is not None:
            self._appended += 1
        self._flushed = self._appended
        if self._size >= self.segment_bytes or self._clock() - self._live_since >= self.segment_age_s:  # type: ignore[operator]
            self._roll_locked()
        return lines[-1]

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # a broken observer must never fail the write it observes
                logger.exception("WAL listener failed")

    def flush(self) -> None:
        """Write buffered records to the file (no fsync)."""
        with self._lock:
            wrote = bool(self._write_out_locked())
        if wrote:
            self._notify()

    # -- durability ----------------------------------------------------------------------

    def sync(self, upto: int | None = None) -> None:
        """Return once every record appended so far (or up to mark `upto`) is in the file
        and, unless fsync is off, fsynced."""
        wrote = False
        try:
            with self._cond:
                target = self._appended if upto is None else upto
                if self._flushed < target:
                    wrote = bool(self._write_out_locked())
                if not self.fsync_enabled or self._durable >= target:
                    return
                self.sync_waits += 1
                while self._durable < target:
                    if self._syncing:
                        self._cond.wait()
                        continue
                    self._fsync_round_locked()
        finally:
            if wrote:
                self._notify()

    async def sync_async(self, upto: int | None = None) -> None:
        """`sync` for coroutines: the event loop never blocks on fsync, and every waiting task
        (and thread) shares the flusher thread's fsync rounds."""
        wrote = False
        with self._lock:
            target = self._appended if upto is None else upto
            if self._flushed < target:
                wrote = bool(self._write_out_locked())
            if not self.fsync_enabled or self._durable >= target:
                fut = None
            else:
                self.sync_waits += 1
                loop = asyncio.get_running_loop()
                fut = loop.create_future()
                self._async_waiters.append((target, loop, fut))
                self._ensure_flusher_locked()
                if not self._syncing:
                    self._flusher_cond.notify()
        if wrote:
            self._notify()
        if fut is not None:
            await fut

    def sync_soon(self, upto: int | None = None) -> None:
        """Ask for records up to `upto` to be fsynced within `durable_delay`, without waiting.

        The next barrier (sync, sync_async) covers them earlier if one comes first."""
        if not self.fsync_enabled:
            return
        with self._lock:
            target = self._appended if upto is None else upto
            if target <= self._durable:
                return
            if self._lazy_target <= self._durable:  # nothing pending: start the clock
                now = time.monotonic()
                self._lazy_deadline = now + self.durable_delay
                self._lazy_recent_until = now + LINGER_S
                self._wake_flusher_locked(self._lazy_deadline)
            self._lazy_target = max(self._lazy_target, target)

    def _fsync_round_locked(self) -> None:
        """One fsync covering everything in the file now; the lock is released while it runs."""
        self._syncing = True
        covered = self._flushed
        fd = self._fd  # a roll-over meanwhile retires this fd rather than closing it under us
        self._lock.release()
        err: OSError | None = None
        try:
            _sync_data(fd)
        except OSError as exc:
            err = exc
        finally:
            self._lock.acquire()
            self._syncing = False
            for old in self._retired:
                os.close(old)
            self._retired = []
        failure = None
        if err is None:
            self.fsyncs += 1
            if covered > self._durable:
                self._durable = covered
        else:
            failure = WALError(f"fsync of {self.path} failed: {err}")
        self._settle_async_locked(failure, covered)
        self._cond.notify_all()
        if self._async_waiters:
            self._flusher_cond.notify()
        if failure is not None:
            raise failure from err

    def _settle_async_locked(self, failure: BaseException | None, covered: int) -> None:
        """Resolve the asyncio waiters this round made durable (or fail those it was for)."""
        if not self._async_waiters:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        still = []
        for entry in self._async_waiters:
            target, loop, fut = entry
            if target <= (self._durable if failure is None else covered):
                by_loop.setdefault(loop, []).append(fut)
            else:
                still.append(entry)
        self._async_waiters = still
        for loop, futs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, futs, failure)
            except RuntimeError:  # that loop is closed: nobody is waiting any more
                pass

    # -- the flusher thread --------------------------------------------------------------

    def _ensure_flusher_locked(self) -> None:
        if self._flusher is None and not self._closed:
            self._flusher = threading.Thread(
                target=self._flusher_loop, name=f"sagaplane-wal-{self.stream_id}", daemon=True
            )
            self._flusher.start()

    def _wake_flusher_locked(self, deadline: float) -> None:
        if self._flusher is None:
            self._ensure_flusher_locked()
        elif deadline < self._flusher_wake_at:
            self._flusher_cond.notify()
            self._flusher_wake_at = float("-inf")  # woken already: no second notify until it waits again

    def _flusher_loop(self) -> None:
        while True:
            wrote = False
            with self._lock:
                while True:
                    if self._closed:
                        return
                    now = time.monotonic()
                    waiting = any(t > self._durable for t, _, _ in self._async_waiters)
                    lazy = self._lazy_target > self._durable
                    if not self._syncing and (waiting or (lazy and now >= self._lazy_deadline)):
                        try:
                            wrote = bool(self._write_out_locked())
                            self._fsync_round_locked()
                        except WALError as exc:
                            if waiting:
                                self._settle_async_locked(exc, self._appended)
                            else:
                                logger.error("%s: %s", self.path, exc)
                                self._lazy_deadline = now + self.durable_delay
                        break
                    if self._buf and now >= self._buf_since + self.flush_interval:
                        try:
                            wrote = bool(self._write_out_locked())
                        except WALError as exc:  # the next write-through or sync will raise it
                            logger.error("%s: %s", self.path, exc)
                            self._buf_since = now
                        break
                    wake = float("inf")
                    if self._buf:
                        wake = self._buf_since + self.flush_interval
                    if lazy and not self._syncing:
                        wake = min(wake, self._lazy_deadline)
                    if wake == float("inf") and now < self._lazy_recent_until:
                        # Steps are coming (a sync_soon within LINGER_S): wake by the earliest
                        # deadline the next one could set, so that it finds this thread due
                        # before its deadline and need not notify it. A notify per durable step
                        # cost the step ~40 us (this thread woken, the GIL handed back and forth).
                        wake = now + self.durable_delay
                    self._flusher_wake_at = wake
                    self._flusher_cond.wait(None if wake == float("inf") else max(0.0, wake - now))
                    self._flusher_wake_at = float("inf")
            if wrote:
                self._notify()

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Called after records reach the file (the shipper uses it to wake up instead of polling)."""
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
                        # Written through: a heartbeat is a liveness signal for the control plane.
                        try:
                            business = _encode_business({"saga_id": sid, "pid": os.getpid()})
                            ts = self._clock()
                            self._sagas.note(Event.SAGA_LEASE, sid, self._base, ts)
                            self._write_out_locked((Event.SAGA_LEASE, ts, business))
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
        """Write and fsync everything (buffered records included), then release the file."""
        with self._lock:
            if self._closed:
                return
            self._closed = True  # no record can follow the final sync
            self._flusher_cond.notify_all()
        self._lease_wake.set()
        try:
            self.sync()
        finally:
            if self._lease_thread is not None:
                self._lease_thread.join(timeout=5)
            if self._flusher is not None:
                self._flusher.join(timeout=30)  # it may be finishing an fsync on this fd
            with self._lock:
                leftover = [fut for _t, _loop, fut in self._async_waiters]
                self._async_waiters = []
            for fut in leftover:
                try:
                    fut.get_loop().call_soon_threadsafe(_settle, [fut], WALError(f"{self.path} was closed"))
                except RuntimeError:  # its loop is gone
                    pass
            _open_wals.discard(self)
            for old in self._retired:
                os.close(old)
            os.close(self._fd)  # also releases the flock

    def __enter__(self) -> WAL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WAL({str(self.path)!r}, stream_id={self.stream_id!r}, seq={self._seq})"


def _settle(futs: list[asyncio.Future[None]], failure: BaseException | None) -> None:
    for fut in futs:
        if not fut.done():
            if failure is None:
                fut.set_result(None)
            else:
                fut.set_exception(failure)
