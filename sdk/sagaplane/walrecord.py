"""A WAL record's parts before and after the file: what an agent may name itself, the encoding of
business fields (refusing what the control plane would refuse), and the torn-tail recovery of the
live file at open."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from .chain import GENESIS, HASH_FIELD, META_FIELDS, canonical, canonical_strict
from .limits import MAX_NESTING, nesting_depth
from .semantics import json_safe

logger = logging.getLogger("sagaplane.wal")

MAX_TORN_BYTES = 1 << 20
_RESERVED = frozenset({"seq", "event", "ts"}) | META_FIELDS

AGENT_NAME_MAX = 100
ENV_AGENT = "SAGAPLANE_AGENT"


def check_agent_name(agent: str | None) -> str | None:
    """The agent's own name (e.g. "billing-bot"), written into each SAGA_START as `agent` so the
    dashboard can show it beside the stream id. None: unnamed. Refused (ValueError) unless it is
    1-100 printable characters, since the control plane shows it as it is."""
    if agent is None:
        return None
    if not isinstance(agent, str):
        raise ValueError("agent: must be a string")
    name = agent.strip()
    if not name or len(name) > AGENT_NAME_MAX or not name.isprintable():
        raise ValueError(f"agent: must be 1-{AGENT_NAME_MAX} printable characters, got {agent!r}")
    return name


class WALError(RuntimeError):
    """The WAL could not record something. Raised before the effect it was guarding."""


class WALLocked(WALError):
    """Another live process is writing this WAL; two writers would fork the chain."""


def encode_business(fields: dict[str, Any]) -> bytes:
    """The canonical bytes of a record's business fields (reserved names dropped).

    Refuses (WALError, before anything is written) what the control plane would refuse: values
    nested deeper than `limits.MAX_NESTING` (the record itself is level 1, and its business
    fields sit on that level) and text that is not UTF-8 (a lone surrogate such as "\\ud800"),
    which no chain can hash."""
    if not fields.keys().isdisjoint(_RESERVED):
        fields = {k: v for k, v in fields.items() if k not in _RESERVED}
    try:
        encoded = canonical_strict(fields)
    except RecursionError:
        raise WALError(f"record refused: its values nest deeper than {MAX_NESTING} levels") from None
    except (TypeError, ValueError):
        # Not plain JSON (NaN, sets, objects...): the logging projection, which caps its own depth.
        try:
            return canonical(json_safe(fields))
        except UnicodeEncodeError as exc:
            raise WALError(f"record refused: its text is not encodable as UTF-8 ({exc.reason})") from None
    # Each level opens a bracket, so a record with few brackets needs no walk.
    if encoded.count(b"{") + encoded.count(b"[") > MAX_NESTING and nesting_depth(fields) > MAX_NESTING:
        raise WALError(f"record refused: its values nest deeper than {MAX_NESTING} levels")
    return encoded


def recover_tail(path: Path, fd: int) -> tuple[str, int, int]:
    """Find the last intact record; cut off a torn tail so the chain resumes from it.

    A crash mid-write leaves a partial last line. Appending after it would glue the
    next record onto the garbage and lose it (agent-saga does exactly that), so the
    partial bytes are moved to `<wal>.torn` and the file is truncated.
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return GENESIS, 0, 0
    keep = size
    found: dict[str, Any] | None = None
    with open(path, "rb") as fh:
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
            raise WALError(f"{path}: {torn} unparseable bytes at the end; refusing to truncate")
        with open(path, "rb") as fh:
            fh.seek(keep)
            garbage = fh.read()
        with open(f"{path}.torn", "ab") as out:
            out.write(garbage if garbage.endswith(b"\n") else garbage + b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.ftruncate(fd, keep)
        os.fsync(fd)
        logger.warning("%s: truncated a torn tail of %d byte(s) (saved to %s.torn)", path, torn, path)
    if found is None:
        return GENESIS, 0, keep
    head = found.get(HASH_FIELD)
    if not isinstance(head, str):
        raise WALError(f"{path}: last record carries no hash; cannot continue its chain")
    seq = found.get("seq")
    return head, seq if isinstance(seq, int) else 0, keep


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
