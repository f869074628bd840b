"""How long the current call may wait for a pooled connection (None: the pool's own timeout).
Set by `core.availability.connection_wait`, read by the database backend
(controlplane/postgres/base.py); a module of its own so the backend imports nothing of the API's."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_wait: contextvars.ContextVar[float | None] = contextvars.ContextVar("connection_wait", default=None)


@contextmanager
def bounded(seconds: float) -> Iterator[None]:
    token = _wait.set(seconds)
    try:
        yield
    finally:
        _wait.reset(token)


def current() -> float | None:
    return _wait.get()
