"""Per-process snapshots of what a tenant's hot path reads (the gate's policies, the approval
policies), reused while the tenant's epoch (`core.epoch`) reads as it did before the snapshot
was read.

One mechanism for every such cache: a snapshot is kept under the epoch read before it was read (a
change committing meanwhile leaves it behind the epoch: re-read next time), reused only while that
epoch still reads the same and for at most `epoch.MAX_AGE_S` (the bound for a lost bump or a
per-process cache), never kept when the epoch cannot be read (`None`), and the least recently used
tenants' are dropped beyond `kept`.

A request that reads several snapshots reads the epoch once: `pinned_epoch` holds what it read for
the tenant while the request runs, and `current_epoch` answers from it.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from core import epoch

if TYPE_CHECKING:
    from core.scoping import Tenant

T = TypeVar("T")

_pinned: contextvars.ContextVar[tuple[int, Any] | None] = contextvars.ContextVar("pinned_epoch", default=None)


def tenant_key(tenant: Tenant) -> str:
    """A tenant's key in every per-process cache: its id and creation time, not its id alone (ids
    repeat where a database is re-created, as tests do; a tenant's creation time does not)."""
    return _key(tenant.pk, tenant.created_at)


@functools.lru_cache(maxsize=4096)
def _key(pk: Any, created_at: datetime) -> str:
    return f"t{pk}.{int(created_at.timestamp() * 1_000_000)}"


@contextmanager
def pinned_epoch(tenant_id: int, version: Any) -> Iterator[None]:
    """While the block runs, `current_epoch(tenant_id)` answers `version` (what this request read)."""
    token = _pinned.set((tenant_id, version))
    try:
        yield
    finally:
        _pinned.reset(token)


def current_epoch(tenant_id: int) -> Any:
    """The tenant's epoch as the running request pinned it, else as the cache reads now (None
    when the cache cannot be read: then nothing is reused)."""
    held = _pinned.get()
    if held is not None and held[0] == tenant_id:
        return held[1]
    return epoch.read(tenant_id)


class SnapshotCache(Generic[T]):
    """One kind of snapshot, per tenant (see the module docstring)."""

    def __init__(self, kept: int = 1000) -> None:
        self.kept = kept
        self._held: OrderedDict[str, tuple[Any, float, T]] = OrderedDict()
        self._lock = threading.Lock()

    def held(self, tenant: Tenant, version: Any) -> T | None:
        """The snapshot kept under `version`, if it is still young enough."""
        if version is None:
            return None
        with self._lock:
            found = self._held.get(tenant_key(tenant))
        if found is None or found[0] != version or time.monotonic() - found[1] >= epoch.MAX_AGE_S:
            return None
        return found[2]

    def read(self, tenant: Tenant, version: Any, reader: Callable[[], T]) -> T:
        """Read a fresh snapshot (in the caller's tenant scope) and keep it under `version`."""
        born = time.monotonic()
        value = reader()
        if version is not None:
            key = tenant_key(tenant)
            with self._lock:
                self._held[key] = (version, born, value)
                self._held.move_to_end(key)
                while len(self._held) > self.kept:
                    self._held.popitem(last=False)
        return value

    def get(self, tenant: Tenant, reader: Callable[[], T]) -> T:
        """The snapshot under the tenant's current epoch, read when there is none."""
        version = current_epoch(tenant.pk)
        held = self.held(tenant, version)
        return held if held is not None else self.read(tenant, version, reader)

    def forget(self, tenant: Tenant) -> None:
        """Drop this process' snapshot of the tenant (a change here, or a test)."""
        with self._lock:
            self._held.pop(tenant_key(tenant), None)

    def keys(self) -> list[str]:
        """The `tenant_key`s of the tenants held (served recently)."""
        with self._lock:
            return list(self._held)
