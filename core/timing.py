"""Where a request's time goes, by phase, answered in a `Server-Timing` header (W3C Server Timing:
`parse;dur=1.20, verify;dur=3.10, ...`, milliseconds). The ingest path marks its phases (parse,
verify, rows, insert_payloads, projection_fold, log_lock, insert_locked, projection_write) and the tenant
view mixin adds `commit`; bench/ingest.py sums
them per batch. Costs one perf_counter pair per phase; nothing is kept after the request."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager

_phases: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("timing", default=None)


@contextmanager
def collecting() -> Iterator[dict[str, float]]:
    """Collect the phases marked inside the block (seconds, by name)."""
    phases: dict[str, float] = {}
    token = _phases.set(phases)
    try:
        yield phases
    finally:
        _phases.reset(token)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the block's duration to phase `name` of the request being collected (if any)."""
    phases = _phases.get()
    if phases is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - start


def header(phases: dict[str, float]) -> str:
    """The `Server-Timing` value: each phase in milliseconds, in the order first marked."""
    return ", ".join(f"{name};dur={seconds * 1000:.3f}" for name, seconds in phases.items())


def parse_header(value: str) -> dict[str, float]:
    """A `Server-Timing` value back to milliseconds by name (what a benchmark reads)."""
    out: dict[str, float] = {}
    for part in value.split(","):
        name, _, rest = part.strip().partition(";")
        for param in rest.split(";"):
            key, _, number = param.strip().partition("=")
            if key == "dur" and name:
                out[name] = out.get(name, 0.0) + float(number)
    return out
