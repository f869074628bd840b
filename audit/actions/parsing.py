"""Parsing a batch: each record type-checked, with what verification and storage need. Anything
that is not a well-formed record is a 400 naming the field."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sagaplane.chain import business_fields
from sagaplane.limits import MAX_NESTING

from audit.actions.common import IngestRefused
from core.numbers import finite_number

_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HEX = re.compile(r"[0-9a-f]+\Z")
STREAM_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,199}\Z")
INDEXED_MAX = {"saga_id": 128, "step_id": 128, "tool": 200}


@dataclass(slots=True)
class Incoming:
    """One batch record, type-checked, with what verification and storage need."""

    raw: dict[str, Any]
    index: int
    seq: int
    ts: Any
    event: str
    cd: str
    ph: str
    h: str
    salt: str | None
    redacted: str
    business: dict[str, Any]


def _bad(index: int, name: str, detail: str) -> IngestRefused:
    where = f"records[{index}].{name}"
    return IngestRefused("invalid", f"{where}: {detail}", field=where, index=index)


def parse_batch(records: Any, *, offset: int = 0) -> list[Incoming]:
    """Type-check a batch. Anything that is not a well-formed record is a 400 naming the field."""
    if not isinstance(records, list):
        raise IngestRefused("invalid", "records: must be a list of record objects", field="records")
    out: list[Incoming] = []
    for i, rec in enumerate(records):
        index = offset + i
        if not isinstance(rec, dict):
            raise IngestRefused("invalid", f"records[{index}]: must be an object", field=f"records[{index}]")
        seq = rec.get("seq")
        if type(seq) is not int:
            raise _bad(index, "seq", "missing" if seq is None else "must be an integer")
        if seq < 0 or seq > 2**62:
            raise _bad(index, "seq", "out of range")
        ts = rec.get("ts")
        if not finite_number(ts):
            raise _bad(index, "ts", "missing" if ts is None else "must be a finite number")
        if abs(ts) > 2**53:
            raise _bad(index, "ts", "out of range")
        event = rec.get("event")
        if not isinstance(event, str) or not event or len(event) > 64:
            raise _bad(index, "event", "must be a non-empty string of at most 64 characters")
        cd, ph, h = (_chain_field(rec, index, name) for name in ("_cd", "_ph", "_h"))
        redacted = rec.get("_redacted") or ""
        if not isinstance(redacted, str) or len(redacted) > 200:
            raise _bad(index, "_redacted", "must be a reason string of at most 200 characters")
        salt = rec.get("_s")
        if salt is not None and (not isinstance(salt, str) or not _HEX.match(salt) or len(salt) > 128):
            raise _bad(index, "_s", "must be a hex string")
        if salt is None and not redacted:
            raise _bad(index, "_s", "missing chain field (salt) on a record not marked redacted")
        business = business_fields(rec)
        for name, limit in INDEXED_MAX.items():
            value = business.get(name)
            if value is not None and (not isinstance(value, str) or len(value) > limit):
                raise _bad(index, name, f"must be a string of at most {limit} characters")
        for name, value in rec.items():
            problem = _unstorable(name, value)
            if problem is not None:
                # The name as a Python literal: it may be the very text that cannot be encoded.
                where = f"records[{index}]"
                raise IngestRefused(problem[0], f"{where} field {name!r}: {problem[1]}", field=where)
        out.append(Incoming(rec, index, seq, ts, event, cd, ph, h, salt, redacted, business))
    return out


def _chain_field(rec: dict[str, Any], index: int, name: str) -> str:
    """A record's chain field `name` (_cd, _ph or _h): 64 lowercase hex characters."""
    value = rec.get(name)
    if value is None:
        raise _bad(index, name, "missing chain field")
    if not isinstance(value, str) or not _HEX64.match(value):
        raise _bad(index, name, "must be 64 lowercase hex characters")
    return value


_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _unstorable(name: str, value: Any) -> tuple[str, str] | None:
    """Why a record's field (name, value) can be neither verified nor stored, or None.

    Lone surrogates (JSON "\\ud800"): the chain hashes UTF-8, which cannot encode them, so no
    writer can have chained one (agent-saga and the SDK both fail to write it). Nesting past
    `MAX_NESTING` (the record is level 1): the SDK refuses to write it, and readers recurse."""
    pending: list[tuple[Any, int]] = [(name, 1), (value, 2)]
    while pending:
        item, level = pending.pop()
        if type(item) is str:
            if not item.isascii() and _LONE_SURROGATE.search(item):
                return "unencodable", "holds a lone surrogate (not UTF-8, so no chain can hash it)"
        elif isinstance(item, dict | list):
            if level > MAX_NESTING:
                return "too_deep", f"nests deeper than {MAX_NESTING} levels (the record is level 1)"
            if isinstance(item, dict):
                pending.extend((key, level) for key in item)
                pending.extend((child, level + 1) for child in item.values())
            else:
                pending.extend((child, level + 1) for child in item)
    return None


def validate_stream_id(stream_id: str) -> None:
    if not STREAM_ID_RE.match(stream_id or ""):
        raise IngestRefused(
            "invalid", "stream: 1-200 characters of letters, digits and ._:- ", field="stream"
        )
