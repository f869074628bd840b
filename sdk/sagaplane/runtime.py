"""`sagaplane.configure()`: one WAL per process, optionally shipped in the background."""

from __future__ import annotations

import atexit
import logging
import os
from dataclasses import dataclass

from .client import ENV_API_KEY, ENV_URL, Client, ConfigurationError
from .saga import ConfirmHook, set_default_confirm, set_default_wal
from .shipper import Shipper
from .wal import ENV_AGENT, WAL

logger = logging.getLogger("sagaplane")


@dataclass
class Runtime:
    wal: WAL
    shipper: Shipper | None

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Make everything durable locally, then wait for the control plane to acknowledge it."""
        self.wal.sync()
        return True if self.shipper is None else self.shipper.flush(timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        try:
            if self.shipper is not None:
                self.shipper.flush(timeout)
                self.shipper.close(timeout)
        finally:
            self.wal.close()


_runtime: Runtime | None = None


def configure(
    wal_path: str | os.PathLike[str] | None = None,
    *,
    url: str | None = None,
    api_key: str | None = None,
    stream_id: str | None = None,
    ship: bool | None = None,
    confirm: ConfirmHook | None = None,
    fsync: bool = True,
    agent: str | None = None,
) -> Runtime:
    """Open the process WAL and, when a control plane is configured, start shipping it.

    `ship=None` ships when a URL is known (argument or SAGAPLANE_URL). A URL without
    an API key is a ConfigurationError rather than a silent local-only run. `agent` (or
    SAGAPLANE_AGENT) names this agent, e.g. "billing-bot": every saga it starts carries the
    name, and the dashboard shows it beside the stream id.
    """
    global _runtime
    if _runtime is not None:
        _runtime.close()
    path = wal_path or os.environ.get("SAGAPLANE_WAL", "sagaplane.wal")
    url = url or os.environ.get(ENV_URL)
    api_key = api_key or os.environ.get(ENV_API_KEY)
    if ship is None:
        ship = bool(url)
    client = Client(url, api_key) if ship else None  # raises ConfigurationError before any file is opened
    wal = WAL(path, stream_id=stream_id, fsync=fsync, agent=agent or os.environ.get(ENV_AGENT) or None)
    shipper = None
    if client is not None:
        shipper = Shipper(wal.path, stream_id=wal.stream_id, client=client).start()
        wal.subscribe(shipper.notify)
    set_default_wal(wal)
    set_default_confirm(confirm)
    _runtime = Runtime(wal, shipper)
    return _runtime


def get_runtime() -> Runtime | None:
    return _runtime


def shutdown(timeout: float | None = 10.0) -> None:
    global _runtime
    if _runtime is not None:
        _runtime.close(timeout)
        _runtime = None
        set_default_wal(None)


atexit.register(shutdown)

__all__ = ["ConfigurationError", "Runtime", "configure", "get_runtime", "shutdown"]
