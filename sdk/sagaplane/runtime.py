"""`sagaplane.configure()`: one WAL per process, optionally shipped in the background."""

from __future__ import annotations

import atexit
import logging
import os
from dataclasses import dataclass

from .client import ENV_API_KEY, ENV_URL, Client, ConfigurationError
from .context import get_default_gate, set_default_confirm, set_default_gate, set_default_wal
from .credentials import Resolver, set_resolver
from .gate import DEFAULT_GRACE_S, Gate
from .shipper import Shipper
from .steps import ConfirmHook
from .wal import ENV_AGENT, SEGMENT_AGE_S, SEGMENT_BYTES, WAL

logger = logging.getLogger("sagaplane")


@dataclass
class Runtime:
    wal: WAL
    shipper: Shipper | None
    gate: Gate | None = None

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Make everything durable locally, then wait for the control plane to acknowledge it."""
        self.wal.sync()
        return True if self.shipper is None else self.shipper.flush(timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        if self.gate is not None:
            self.gate.close()
            if get_default_gate() is self.gate:
                set_default_gate(None)
        try:
            if self.shipper is not None:
                self.shipper.flush(timeout)
                self.shipper.close(timeout)
        finally:
            self.wal.close()


_runtime: Runtime | None = None
_shut_down = False  # `shutdown()` closed a runtime and no `configure()` came after it


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
    gate: bool | None = None,
    gate_grace: float = DEFAULT_GRACE_S,
    gate_leases: bool = False,
    segment_bytes: int = SEGMENT_BYTES,
    segment_age_s: float = SEGMENT_AGE_S,
    secret_resolver: Resolver | None = None,
) -> Runtime:
    """Open the process WAL and, when a control plane is configured, start shipping it.

    `ship=None` ships when a URL is known (argument or SAGAPLANE_URL). A URL without
    an API key is a ConfigurationError rather than a silent local-only run. `agent` (or
    SAGAPLANE_AGENT) names this agent, e.g. "billing-bot": every saga it starts carries the
    name, and the dashboard shows it beside the stream id.

    `gate=None` asks the control plane's pre-flight gate before every step whenever a URL is known
    (the API key needs the `gate` scope); `gate=False` turns it off. With the gate on, a control
    plane unreachable for longer than `gate_grace` seconds refuses every step (fail closed).
    `gate_leases=True` decides budgeted calls in process within budget leases the control plane
    grants (`sagaplane.leases`; ARCHITECTURE §8.3).

    The WAL rolls over to a new segment past `segment_bytes` or `segment_age_s`; a sealed segment
    the control plane has acknowledged and no open saga needs is removed (ARCHITECTURE §3, "The
    WAL's life"). Without shipping nothing is ever removed.

    `secret_resolver(ref) -> value` resolves the `sp.secret("ref")` credential references in tools'
    arguments when each call is made (None: `sp.EnvSecrets()`, the `SAGAPLANE_SECRET_<REF>`
    variables); records only ever hold the reference (sagaplane.credentials).
    """
    global _runtime, _shut_down
    if _runtime is not None:
        _runtime.close()
    _shut_down = False
    path = wal_path or os.environ.get("SAGAPLANE_WAL", "sagaplane.wal")
    url = url or os.environ.get(ENV_URL)
    api_key = api_key or os.environ.get(ENV_API_KEY)
    if ship is None:
        ship = bool(url)
    client = Client(url, api_key) if ship else None  # raises ConfigurationError before any file is opened
    wal = WAL(
        path,
        stream_id=stream_id,
        fsync=fsync,
        agent=agent or os.environ.get(ENV_AGENT) or None,
        segment_bytes=segment_bytes,
        segment_age_s=segment_age_s,
    )
    shipper = None
    if client is not None:
        shipper = Shipper(wal.path, stream_id=wal.stream_id, client=client)
        shipper.on_acknowledged(wal.acknowledge)
        wal.subscribe(shipper.notify)
        shipper.start()
    gate_client = None
    if gate is None:
        gate = bool(url)
    if gate:
        gate_client = Gate(url, api_key, grace=gate_grace, leases=gate_leases).start()
    set_default_wal(wal)
    set_resolver(secret_resolver)
    set_default_confirm(confirm)
    set_default_gate(gate_client)
    _runtime = Runtime(wal, shipper, gate_client)
    return _runtime


def status() -> dict[str, object]:
    """May this agent act now? `{"ready": bool, "state": "ready" | "halted" | "unknown" | "ungated"
    | "shut_down", ...}`. Unknown (the control plane not read within the grace period) is not
    ready; nor is a process after `shutdown()` (no WAL, no gate: nothing may run) until it
    configures again."""
    if _shut_down:
        return {"ready": False, "state": "shut_down", "halts": [], "state_age_s": None}
    gate = get_default_gate()
    if gate is None:
        return {"ready": True, "state": "ungated", "halts": [], "state_age_s": None}
    return gate.status()


def get_runtime() -> Runtime | None:
    return _runtime


def shutdown(timeout: float | None = 10.0) -> None:
    global _runtime, _shut_down
    if _runtime is not None:
        _shut_down = True
        _runtime.close(timeout)
        _runtime = None
        set_default_wal(None)


atexit.register(shutdown)

__all__ = ["ConfigurationError", "Runtime", "configure", "get_runtime", "shutdown"]
