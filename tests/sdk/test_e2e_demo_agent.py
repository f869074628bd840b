"""The demo agent as `make run` starts it: `--forever`, WAL under SAGAPLANE_WAL_DIR, shipping to the
real control plane; SIGTERM makes it flush and exit cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import sagaplane as sp
from sagaplane.chain import verify_chain
from sagaplane_testkit import read_wal

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "sdk" / "examples" / "demo_agent.py"


def test_demo_agent_forever_ships_until_terminated(
    transactional_db: None, live_server: Any, alice: Any, tmp_path: Path
) -> None:
    wal_dir = tmp_path / "demo-agent"
    env = {k: v for k, v in os.environ.items() if k not in ("SAGAPLANE_WAL",)}
    env.update(SAGAPLANE_URL=live_server.url, SAGAPLANE_API_KEY=alice.api_key, SAGAPLANE_WAL_DIR=str(wal_dir))
    proc = subprocess.Popen(
        [sys.executable, str(DEMO), "--forever", "--pause", "0.01"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        sagas = [proc.stdout.readline() for _ in range(12)]  # it keeps going past any --sagas default
        assert all(": " in line for line in sagas), sagas
        proc.send_signal(signal.SIGTERM)
        tail = proc.stdout.read()
        assert proc.wait(60) == 0, tail  # flushed everything before exiting
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert "shipped to" in tail and "yes" in tail.splitlines()[-1]

    wal = wal_dir / "demo-agent.wal"
    records = read_wal(wal)
    assert verify_chain(records).intact
    stream = (wal_dir / "demo-agent.wal.meta.json").read_text()
    client = sp.Client(live_server.url, alice.api_key)
    listing = client.get("/api/v1/sagas?limit=1000")
    assert listing.status == 200
    body = listing.body
    held = body["results"]
    started = {r["saga_id"] for r in records if r["event"] == "SAGA_START"}
    assert body["next"] is None and len(held) == len(started) >= 12
    assert started == {s["saga_id"] for s in held}
    assert all(s["stream_id"] in stream for s in held)
    statuses = {s["status"] for s in held}
    assert "completed" in statuses and statuses & {"rolled_back", "rollback_partial"}
