"""The demo agent runs for hours with a bounded WAL directory: `make run` starts it shipping, with the
WAL's default segments (`sp.configure` without segment options), and its own sagas, run at its own
pace on a simulated clock (no sleeps) and acknowledged by a control plane double, keep the WAL's
files under the documented bound (ARCHITECTURE §3, "Disk bound": 3 x segment_bytes + 16 KiB)."""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import sagaplane as sp
from sagaplane import rollback
from sagaplane.chain import verify_chain
from sagaplane.saga import set_default_wal
from sagaplane.segments import disk_usage
from sagaplane.wal import SEGMENT_AGE_S, SEGMENT_BYTES
from test_sdk_wal_segments import AckingClient, Clock, records_of

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "sdk" / "examples" / "demo_agent.py"
BOUND = 3 * SEGMENT_BYTES + (16 << 10)


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_agent_for_hours", DEMO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_run_starts_the_demo_agent_shipping_with_the_default_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = (ROOT / "infra" / "run-embedded.sh").read_text()
    line = next(x for x in script.splitlines() if "demo_agent.py --forever" in x)
    assert "--no-ship" not in line and "--wal" not in line  # ships; its WAL in SAGAPLANE_WAL_DIR
    assert re.search(r"SAGAPLANE_URL=", script) and re.search(r"SAGAPLANE_API_KEY=", script)
    opened: list[Any] = []
    real = sp.configure

    def configure(*args: Any, **kwargs: Any) -> sp.Runtime:
        runtime = real(*args, **kwargs)
        opened.append((runtime.wal.segment_bytes, runtime.wal.segment_age_s))
        return runtime

    monkeypatch.setattr(sp, "configure", configure)
    assert load_demo().main(["--sagas", "1", "--no-ship", "--quiet", "--wal", str(tmp_path / "d.wal")]) == 0
    assert opened == [(SEGMENT_BYTES, SEGMENT_AGE_S)]


@pytest.mark.parametrize(("pause_s", "hours"), [(1.5, 2), (60.0, 12)], ids=["busy", "quiet"])
def test_the_demo_agent_for_hours_keeps_its_wal_directory_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pause_s: float, hours: int
) -> None:
    """The demo's pace (`--pause`, 1.5 s by default: segments roll over by size; a quiet agent's by
    age), its mix of completed and rolled-back sagas, the shipper catching up every 5 minutes."""
    demo = load_demo()
    clock = Clock()
    monkeypatch.setattr(rollback.time, "sleep", lambda seconds: None)  # the rollback's retry pauses
    logging.disable(logging.ERROR)  # the demo's failing refunds are logged loudly, by design
    path = tmp_path / "demo-agent.wal"
    wal = sp.WAL(path, fsync=False, clock=clock)  # what sp.configure opens for the demo
    client = AckingClient()
    shipper = sp.Shipper(path, stream_id=wal.stream_id, client=client)  # type: ignore[arg-type]
    shipper.on_acknowledged(wal.acknowledge)
    set_default_wal(wal)
    largest, sagas, shipped_at = 0, 0, clock.now
    try:
        end = clock.now + hours * 3600
        while clock.now < end:
            demo.checkout(sagas)
            sagas += 1
            clock.now += pause_s
            if clock.now - shipped_at >= 300:  # the most the files hold: just before shipping
                largest = max(largest, disk_usage(path))
                wal.flush()
                shipper.run_until_caught_up()
                shipped_at = clock.now
        wal.flush()
        shipper.run_until_caught_up()
        written = wal.seq
    finally:
        logging.disable(logging.NOTSET)
        set_default_wal(None)
        wal.close()
    files = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert largest <= BOUND and files <= BOUND, (largest, files, BOUND)
    assert wal.rolls >= 2 and wal.removed_segments >= 1  # it did roll over and remove, for hours
    assert client.count == written  # every record held by the control plane before it left
    assert verify_chain(records_of(path)).intact
