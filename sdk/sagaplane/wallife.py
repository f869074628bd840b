"""The WAL's life (ARCHITECTURE §3): opening from the live segment, roll-over, acknowledgement and
removal. `WAL` inherits these; the files are `segments`, the policy and attestation `walcompact`."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .chain import GAP_EVENT, GENESIS
from .segments import Manifest, remove_segments, roll
from .walcompact import OpenSagas, attestation, removable, scan_live
from .walrecord import recover_tail

logger = logging.getLogger("sagaplane.wal")
# A sealed segment is durable before the manifest names it: data and size, as for appends.
_sync_data: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


class SegmentedLog:
    """The segment bookkeeping of a WAL (its writer state lives in `wal.WAL`)."""

    path: Path
    segment_bytes: int
    segment_age_s: float
    _clock: Callable[[], float]
    _lock: threading.Lock
    _cond: threading.Condition
    _fd: int
    _head: str
    _seq: int
    _size: int
    _syncing: bool
    _closed: bool
    _flushed: int
    _durable: int
    fsyncs: int

    def _init_life(self) -> None:
        self._retired: list[int] = []  # sealed segments' fds an fsync round may still be using
        self._acked: int | None = None  # logical offset the control plane holds everything before
        self._compacting = False
        self._hold_roll = False
        self.rolls = 0
        self.removed_segments = 0

    def _settle_async_locked(self, failure: BaseException | None, covered: int) -> None:
        raise NotImplementedError

    def write(self, event: str, fields: dict[str, Any] | None = None) -> tuple[dict[str, Any], int]:
        raise NotImplementedError

    def sync(self, upto: int | None = None) -> None:
        raise NotImplementedError

    # -- opening: the live segment and what open sagas need ------------------------------

    def _open_segments(self, manifest: Manifest | None) -> None:
        """Resume the chain from the live segment's tail (the manifest's head when it is empty), and
        rebuild the open sagas from the manifest plus one pass over the live segment: what opening
        reads is bounded by the segment size, not by the history."""
        self._manifest = manifest or Manifest()
        head, seq, size = recover_tail(self.path, self._fd)
        if head == GENESIS and manifest is not None:
            head, seq = manifest.head_hash, manifest.head_seq
        self._head, self._seq, self._size = head, seq, size
        self._base = self._manifest.live_base
        self._sagas = OpenSagas(self._manifest.sagas)
        self._live_since: float | None = self._clock() if size else None
        with open(self.path, "rb") as fh:
            attested = scan_live(fh.read(), self._sagas, self._base)  # at most one segment
        gone = [s for s in self._manifest.segments if s.base in attested]
        if gone:  # a removal whose attestation is chained but whose files a crash left
            _, trimmed = attestation(self.path, gone)
            self._manifest = remove_segments(self.path, self._manifest, gone, trimmed)

    def _roll_locked(self) -> None:
        """Seal the live segment and start the next (`segments.roll`). The records are written
        already: a failure here is logged and the roll-over retried after the next write."""
        if self._hold_roll:  # a removal is between its attestation and its manifest (see compact)
            return
        old = self._fd
        try:
            _sync_data(old)  # a sealed segment is durable before the manifest names it
            self._manifest.sagas = self._sagas.snapshot()
            self._fd, self._manifest = roll(self.path, old, self._manifest, self._size, self._head, self._seq)
        except OSError as exc:
            logger.error("%s: roll-over failed (the live segment keeps growing): %s", self.path, exc)
            return
        if self._syncing:
            self._retired.append(old)  # an fsync round holds it: closed when the round ends
        else:
            os.close(old)
        self.fsyncs += 1
        self.rolls += 1
        self._base, self._size, self._live_since = self._manifest.live_base, 0, None
        self._durable = self._flushed
        self._settle_async_locked(None, self._durable)
        self._cond.notify_all()

    # -- acknowledgement and removal (walcompact) -------------------------------------------

    def acknowledge(self, offset: int) -> int:
        """The control plane holds every record before logical `offset` (a shipper's verified
        cursor). Removes what may leave now; returns how many segments left."""
        with self._lock:
            if self._acked is None or offset > self._acked:
                self._acked = offset
        return self.compact()

    def compact(self) -> int:
        """Remove the sealed segments that were acknowledged and that no open saga needs, after a
        chained, fsynced WAL_CHAIN_GAP naming what left. A WAL never acknowledged keeps everything."""
        with self._lock:
            if self._closed or self._compacting:
                return 0
            gone = removable(self._manifest, self._acked, self._sagas.pinned_from(self._clock()))
            if not gone:
                return 0
            self._compacting = True
        try:
            fields, trimmed = attestation(self.path, gone)  # sealed segments never change: no lock
            # The attestation stays in the live segment until the files are gone, where the next
            # open looks for it if a crash comes first.
            with self._lock:
                self._hold_roll = True
            _record, mark = self.write(GAP_EVENT, fields)
            self.sync(mark)
            with self._lock:
                self._hold_roll = False
                if self._closed:  # the next open finishes it from the attestation
                    return 0
                self._manifest = remove_segments(self.path, self._manifest, gone, trimmed)
            self.removed_segments += len(gone)
            return len(gone)
        finally:
            self._compacting = self._hold_roll = False
