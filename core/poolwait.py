"""How long the current call may wait for a pooled connection (None: the pool's own timeout).
Set by `core.availability` (`connection_wait` for the gate, `RequestConnectionWait` for every
other request), read by the database backend (controlplane/postgres/base.py); a module of its own
so the backend imports nothing of the API's."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Wait:
    """A call's wait for a pooled connection: `first` seconds; then, when `patient`, the rest of
    the pool's own timeout, unless the database refused a connection during the first part (an
    outage, answered within a second, where a pool that is only busy is waited out)."""

    first: float
    patient: bool


_wait: contextvars.ContextVar[Wait | None] = contextvars.ContextVar("connection_wait", default=None)


@contextmanager
def waiting(wait: Wait) -> Iterator[None]:
    token = _wait.set(wait)
    try:
        yield
    finally:
        _wait.reset(token)


def current() -> Wait | None:
    return _wait.get()
