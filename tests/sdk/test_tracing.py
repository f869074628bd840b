"""The SDK's trace context: every batch carries a W3C traceparent, with OpenTelemetry installed
(a span per batch with the saga ids, a span per saga with its id) and without it (a fresh one)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sagaplane import tracing
from sagaplane_testkit import API_KEY, FakeControlPlane

TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}\Z")
SDK_ROOT = Path(sp.__file__).resolve().parents[1]


@pytest.fixture
def server() -> Any:
    s = FakeControlPlane()
    yield s
    s.close()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """The SDK's tracer from a provider of this test's own (the process' global one is left alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert tracing._trace is not None
    monkeypatch.setattr(tracing._trace, "get_tracer", lambda name, *a, **k: provider.get_tracer(name))
    return exporter


def test_each_batch_is_a_span_whose_context_the_server_receives(
    tmp_path: Path, server: FakeControlPlane, spans: InMemorySpanExporter
) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    with sp.saga(name="checkout", wal=wal) as saga:
        pass
    wal.append("SAGA_START", {"saga_id": "second-saga", "pid": 1, "lease_ttl": 30.0})
    shipper = sp.Shipper(wal.path, url=server.url, api_key=API_KEY)
    assert shipper.run_until_caught_up() == 3
    wal.close()
    (sent,) = [t for t in server.traceparents if t]
    match = TRACEPARENT.match(sent)
    assert match and sent == shipper.last_traceparent
    finished = {span.name: span for span in spans.get_finished_spans()}
    ship = finished["sagaplane.ship"]
    assert format(ship.context.trace_id, "032x") == match.group(1)
    assert format(ship.context.span_id, "016x") == match.group(2)
    assert ship.attributes is not None
    assert list(ship.attributes["sagaplane.saga_ids"]) == [saga.saga_id, "second-saga"]
    assert ship.attributes["sagaplane.records"] == 3 and ship.attributes["http.response.status_code"] == 200
    saga_span = finished["saga checkout"]
    assert saga_span.attributes is not None and saga_span.attributes["sagaplane.saga_id"] == saga.saga_id


def test_without_a_configured_provider_each_batch_gets_a_fresh_traceparent(
    tmp_path: Path, server: FakeControlPlane
) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    for n in range(4):
        wal.append("SAGA_START", {"saga_id": f"s{n}", "pid": 1, "lease_ttl": 30.0})
    shipper = sp.Shipper(wal.path, url=server.url, api_key=API_KEY, batch_size=2)
    assert shipper.run_until_caught_up() == 4
    wal.close()
    sent = [t for t in server.traceparents if t]
    assert len(sent) == 2 and all(TRACEPARENT.match(t) for t in sent)
    assert len({TRACEPARENT.match(t).group(1) for t in sent}) == 2  # type: ignore[union-attr]


def test_the_sdk_ships_without_opentelemetry_installed(tmp_path: Path, server: FakeControlPlane) -> None:
    script = f"""
import sys
sys.modules["opentelemetry"] = None  # as if not installed: any import of it fails
import sagaplane as sp
wal = sp.WAL({str(tmp_path / "a.wal")!r}, fsync=False)
with sp.saga(name="plain", wal=wal):
    pass
shipper = sp.Shipper(wal.path, url={server.url!r}, api_key={API_KEY!r})
print(shipper.run_until_caught_up(), shipper.last_traceparent)
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(SDK_ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    shipped, traceparent = result.stdout.split()
    assert shipped == "2" and TRACEPARENT.match(traceparent)
    assert server.traceparents == [traceparent]
