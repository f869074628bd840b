"""WAL segments: the live file, the sealed segments beside it, and the manifest naming them.

For a WAL at `agent.wal`:

- `agent.wal` is the live segment, the only file ever written. A WAL that never rolled over is
  just this file (every single-file WAL, ours or agent-saga's, is a segmented WAL of one segment).
- `agent.wal.segments/<base>.wal` are sealed segments: immutable, named by their base, the logical
  offset of their first byte (20 decimal digits, so names sort in log order).
- `agent.wal.segments/manifest.json` (replaced atomically) lists the sealed segments still on
  disk, the live segment's base, the chain head at the last seal, where removal has trimmed the
  log, and the sagas open at the last seal (`walcompact.OpenSagas`).

Offsets are logical: a record's offset is its segment's base plus its offset in that file. A
single-file WAL's offsets are its byte offsets, so a shipper's cursor survives roll-over and
removal unchanged. Readers (`LogReader`) read the log as one stream of bytes from any offset;
bytes that removal took are skipped (reading resumes at the first segment kept).

Roll-over (`roll`, under the writer's lock; see `recover` for every crash point):
  1. the live file is fsynced;
  2. it is hard-linked as `<base>.wal` (the live path still names it);
  3. the manifest is replaced: the new segment listed, the live base moved past it;
  4. a fresh file `agent.wal.next` is created, locked, and renamed over `agent.wal`.
The live path therefore always names a whole file the writer holds locked.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._files import atomic_write_json, fsync_dir, read_json
from .chain import GENESIS

try:
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

FORMAT = "sagaplane-wal-segments/1"
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Segment:
    base: int  # logical offset of its first byte
    size: int

    @property
    def end(self) -> int:
        return self.base + self.size


@dataclass
class Manifest:
    live_base: int = 0
    head_hash: str = GENESIS  # the last record of the sealed segments (the head when live is empty)
    head_seq: int = 0
    segments: list[Segment] = field(default_factory=list)
    # The record just before the first byte kept after a removal: {"end", "hash", "seq"}. A shipper
    # whose control plane's head is that record resumes at `end`.
    trimmed: dict[str, Any] | None = None
    sagas: dict[str, list[Any]] = field(default_factory=dict)  # walcompact.OpenSagas at the last seal

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "live_base": self.live_base,
            "head": {"hash": self.head_hash, "seq": self.head_seq},
            "segments": [[s.base, s.size] for s in self.segments],
            "trimmed": self.trimmed,
            "sagas": self.sagas,
        }


def segment_dir(path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(path)}.segments")


def segment_path(path: str | os.PathLike[str], base: int) -> Path:
    return segment_dir(path) / f"{base:020d}.wal"


def _manifest_path(path: str | os.PathLike[str]) -> Path:
    return segment_dir(path) / "manifest.json"


def load_manifest(path: str | os.PathLike[str]) -> Manifest | None:
    """The manifest, or None for a WAL that never rolled over (one file, base 0)."""
    data = read_json(_manifest_path(path))
    if not isinstance(data, dict):
        return None
    if data.get("format") != FORMAT:
        raise ValueError(f"{_manifest_path(path)}: unknown format {data.get('format')!r}")
    head = data.get("head") or {}
    return Manifest(
        live_base=int(data["live_base"]),
        head_hash=str(head.get("hash") or GENESIS),
        head_seq=int(head.get("seq") or 0),
        segments=[Segment(int(b), int(s)) for b, s in data.get("segments") or []],
        trimmed=data.get("trimmed"),
        sagas=dict(data.get("sagas") or {}),
    )


def save_manifest(path: str | os.PathLike[str], manifest: Manifest) -> None:
    atomic_write_json(_manifest_path(path), manifest.as_json())


# -- writing: roll-over and removal (the writer holds the live file's lock) ----------------------------


def lock_file(fd: int, path: Path) -> None:
    """Take the exclusive writer lock on `fd`; WALLocked-worthy OSError when another process has it."""
    if fcntl is None:  # pragma: no cover
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise BlockingIOError(
                errno.EAGAIN, f"{path} is already open for writing by another process"
            ) from exc
        raise


def _fresh_live(path: Path) -> int:
    """Steps 4 of a roll-over: a new empty live file, locked before it takes the live path."""
    nxt = Path(f"{path}.next")
    fd = os.open(nxt, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        lock_file(fd, nxt)
        os.replace(nxt, path)
    except BaseException:
        os.close(fd)
        raise
    fsync_dir(path.parent)
    return fd


def roll(path: Path, fd: int, manifest: Manifest, size: int, head: str, seq: int) -> tuple[int, Manifest]:
    """Seal the live file (`size` bytes, fsynced by the caller) and start a new one. Returns the new
    live fd (locked) and the manifest now on disk. The caller closes `fd` when nobody uses it."""
    segment_dir(path).mkdir(exist_ok=True)
    sealed = segment_path(path, manifest.live_base)
    with contextlib.suppress(FileNotFoundError):
        sealed.unlink()  # a link left by a roll-over that crashed before its manifest
    os.link(path, sealed)
    fsync_dir(sealed.parent)
    updated = Manifest(
        live_base=manifest.live_base + size,
        head_hash=head,
        head_seq=seq,
        segments=[*manifest.segments, Segment(manifest.live_base, size)],
        trimmed=manifest.trimmed,
        sagas=manifest.sagas,
    )
    save_manifest(path, updated)
    return _fresh_live(path), updated


def remove_segments(path: Path, manifest: Manifest, gone: list[Segment], trimmed: dict[str, Any]) -> Manifest:
    """Drop `gone` (a prefix of the sealed segments, already attested in the chain) from the manifest,
    then from the disk. A crash between the two leaves files the manifest no longer names, which
    `recover` deletes."""
    bases = {s.base for s in gone}
    updated = Manifest(
        live_base=manifest.live_base,
        head_hash=manifest.head_hash,
        head_seq=manifest.head_seq,
        segments=[s for s in manifest.segments if s.base not in bases],
        trimmed=trimmed,
        sagas=manifest.sagas,
    )
    save_manifest(path, updated)
    for base in sorted(bases):
        with contextlib.suppress(FileNotFoundError):
            segment_path(path, base).unlink()
    fsync_dir(segment_dir(path))
    return updated


def recover(path: Path, fd: int) -> tuple[int, Manifest | None]:
    """Finish whatever a crash interrupted, before the writer uses `fd` (the live file, locked).

    - a roll-over stopped after its link (step 2) but before its manifest: the live path still
      names the data; the stray link is removed;
    - stopped after its manifest (step 3) but before the new live file took the path: the live path
      still names the sealed segment; a fresh live file replaces it (returned as the new fd);
    - a removal stopped after its manifest: files it no longer names are deleted;
    - `agent.wal.next` left by a crash before its rename is deleted.
    """
    with contextlib.suppress(FileNotFoundError):
        Path(f"{path}.next").unlink()
    manifest = load_manifest(path)
    folder = segment_dir(path)
    if manifest is None:
        if folder.is_dir():
            for stray in folder.glob("*.wal"):
                stray.unlink()  # links of a first roll-over that never reached its manifest
        return fd, None
    listed = {segment_path(path, s.base) for s in manifest.segments}
    for found in folder.glob("*.wal"):
        if found not in listed:
            found.unlink()
    last = manifest.segments[-1] if manifest.segments else None
    if last is not None and os.path.samestat(os.fstat(fd), os.stat(segment_path(path, last.base))):
        new_fd = _fresh_live(path)
        os.close(fd)
        fd = new_fd
    fsync_dir(folder)
    return fd, manifest


# -- reading: the log as one stream of bytes -----------------------------------------------------------


class LogReader:
    """Read a (possibly segmented) WAL from a logical offset, as one file of JSON lines.

    Sealed segments end on a record boundary, so no line spans two files. The live file is opened
    only when the manifest read before and after opening it agree (and it is not the segment a
    roll-over is sealing), so a reader racing a roll-over never reads new bytes at old offsets."""

    def __init__(self, path: str | os.PathLike[str], offset: int = 0) -> None:
        self.path = Path(path)
        self._fh: Any = None
        self._end: int | None = None  # the current file's logical end (None: the live file)
        self._pos = 0
        self.seek(offset)

    def seek(self, offset: int) -> None:
        self.close()
        self._pos = offset
        self._fh, base, self._end = _open_at(self.path, offset)
        if self._fh is not None:
            self._pos = max(offset, base)
            self._fh.seek(self._pos - base)

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = _READ_CHUNK) -> bytes:
        while self._fh is not None:
            data = self._fh.read(n)
            if data:
                self._pos += len(data)
                return bytes(data)
            if self._end is None or self._pos < self._end:
                return b""  # the live file's end (or a sealed one cut short: read nothing more)
            self.seek(self._end)
        return b""

    def readline(self) -> bytes:
        while self._fh is not None:
            line = self._fh.readline()
            if line:
                self._pos += len(line)
                return bytes(line)
            if self._end is None or self._pos < self._end:
                return b""
            self.seek(self._end)
        return b""

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_at(path: Path, offset: int) -> tuple[Any, int, int | None]:
    """(file object, its base, its logical end or None for the live file) holding `offset`, or the
    first file after it when removal took it; (None, offset, None) when there is no WAL."""
    for _ in range(1000):  # each turn means a roll-over or removal completed meanwhile
        manifest = load_manifest(path)
        if manifest is not None:
            for seg in manifest.segments:
                if offset < seg.end:
                    try:
                        return open(segment_path(path, seg.base), "rb"), seg.base, seg.end  # noqa: SIM115
                    except FileNotFoundError:
                        break  # removed since the manifest was read: read it again
            else:
                opened = _open_live(path, manifest)
                if opened is not None:
                    return opened
            continue
        opened = _open_live(path, None)
        if opened is not None:
            return opened
    raise OSError(f"{path}: the WAL kept changing while it was being opened")


def _open_live(path: Path, before: Manifest | None) -> tuple[Any, int, None] | None:
    try:
        fh = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        return (None, before.live_base if before else 0, None) if _stable(path, before) else None
    after = load_manifest(path)
    same = (after is None) == (before is None) and (after is None or after.live_base == before.live_base)  # type: ignore[union-attr]
    if same and before is not None and before.segments:
        last = segment_path(path, before.segments[-1].base)
        with contextlib.suppress(FileNotFoundError):
            same = not os.path.samestat(os.fstat(fh.fileno()), os.stat(last))
    if not same:
        fh.close()
        return None
    return fh, before.live_base if before else 0, None


def _stable(path: Path, before: Manifest | None) -> bool:
    after = load_manifest(path)
    if after is None or before is None:
        return after is None and before is None
    return after.live_base == before.live_base


def end_offsets(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(the logical offset just past the last complete line, the logical end of the bytes). They
    differ by a partial last line: a write in progress, or torn by a crash; no record yet."""
    fh, base, _ = _open_at(Path(path), 1 << 62)
    if fh is None:
        return base, base
    with fh:
        pos = size = fh.seek(0, os.SEEK_END)
        while pos > 0:
            n = min(65536, pos)
            pos -= n
            fh.seek(pos)
            i = fh.read(n).rfind(b"\n")
            if i >= 0:
                return base + pos + i + 1, base + size
        return base, base + size


def complete_end(path: str | os.PathLike[str]) -> int:
    """The logical offset just past the last complete line."""
    return end_offsets(path)[0]


def disk_usage(path: str | os.PathLike[str]) -> int:
    """Bytes the WAL's files hold: the live file and the sealed segments (the bound the docs give)."""
    total = 0
    with contextlib.suppress(FileNotFoundError):
        total += os.path.getsize(path)
    folder = segment_dir(path)
    if folder.is_dir():
        total += sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return total
