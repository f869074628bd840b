"""The example agent that seed_demo runs: it must ship a verifiable WAL with mixed outcomes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sagaplane.chain import verify_chain
from sagaplane_testkit import API_KEY, FakeControlPlane, read_wal

DEMO = Path(__file__).resolve().parents[2] / "sdk" / "examples" / "demo_agent.py"


def test_demo_agent_ships_mixed_outcomes(tmp_path: Any) -> None:
    server = FakeControlPlane()
    try:
        env = {**os.environ, "SAGAPLANE_URL": server.url, "SAGAPLANE_API_KEY": API_KEY}
        wal = tmp_path / "demo.wal"
        out = subprocess.run(
            [sys.executable, str(DEMO), "--sagas", "25", "--wal", str(wal), "--quiet"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        records = read_wal(wal)
        assert verify_chain(records).intact
        (stream,) = server.streams
        assert server.records(stream) == records
        ends = [r for r in records if r["event"] == "ROLLBACK_END"]
        assert any(e["clean"] for e in ends) and any(not e["clean"] for e in ends)
        assert any(r["event"] == "SAGA_COMPLETE" for r in records)
    finally:
        server.close()
