"""Record values that a database column or a strict JSON reader cannot hold, and the copies made
for them.

Every record that verifies is stored exactly: its payload as ASCII-escaped JSON text (any string,
NaN, Infinity, any int), its header text (`event`, `_redacted`) in `Record.verbatim` when a column
cannot hold it. Postgres refuses NUL in `text` and `jsonb`, and `jsonb` refuses NaN and Infinity,
so the columns used to filter and to show (Record.saga_id/tool/..., the saga projection) hold
*index copies* made here: NUL becomes U+FFFD, non-finite numbers become the strings "NaN",
"Infinity", "-Infinity". The exact values are always the records'.

Records are served (saga API, disclosures) as JSON objects; strict JSON has no NaN or Infinity,
so a record that holds one is served with those numbers as strings in `record` and, beside it,
`record_json`: the record as JSON text in the chain's canonical dialect (Python's and agent-saga's,
where they are the bare tokens NaN, Infinity, -Infinity), which parses back to the record exactly.
"""

from __future__ import annotations

import json
import math
from typing import Any

REPLACEMENT = "\ufffd"
_NONFINITE_NAMES = {math.inf: "Infinity", -math.inf: "-Infinity"}


def index_text(value: str) -> str:
    """A string as a text column can hold it (Postgres refuses NUL)."""
    return value.replace("\x00", REPLACEMENT) if "\x00" in value else value


def _nonfinite_name(value: float) -> str:
    return "NaN" if value != value else _NONFINITE_NAMES[value]


def _copy(value: Any, *, text: bool) -> tuple[Any, bool]:
    """(a copy with non-finite floats as strings and, with text=True, NUL replaced in every
    string and key; whether anything changed). Iterative: records may nest up to the limit."""
    changed = False

    def scalar(item: Any) -> Any:
        nonlocal changed
        if type(item) is float and not math.isfinite(item):
            changed = True
            return _nonfinite_name(item)
        if text and type(item) is str and "\x00" in item:
            changed = True
            return index_text(item)
        return item

    if not isinstance(value, dict | list):
        return scalar(value), changed
    root: Any = {} if isinstance(value, dict) else []
    pending: list[tuple[Any, Any]] = [(value, root)]
    while pending:
        source, target = pending.pop()
        pairs = source.items() if isinstance(source, dict) else enumerate(source)
        for key, item in pairs:
            if isinstance(item, dict | list):
                copy: Any = {} if isinstance(item, dict) else []
                pending.append((item, copy))
            else:
                copy = scalar(item)
            if isinstance(target, list):
                target.append(copy)
            else:
                target[scalar(key) if isinstance(key, str) else key] = copy
    return root, changed


def index_json(value: Any) -> Any:
    """A JSON value as a `jsonb` column can hold it (no NUL, no NaN or Infinity)."""
    return _copy(value, text=True)[0]


def served(record: dict[str, Any]) -> dict[str, Any]:
    """`{"record": ...}` for a stored (or masked) record, plus `record_json` when strict JSON
    cannot carry it as it is (see the module docstring)."""
    standard, changed = _copy(record, text=False)
    if not changed:
        return {"record": record}
    exact = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return {"record": standard, "record_json": exact}
