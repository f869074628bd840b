"""A SIGKILLed agent: killed after its effect, before its commit record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

from agent_saga import integrity
from sagaplane.chain import verify_chain
from sagaplane_testkit import API_KEY, CRASHING_AGENT_PRELUDE, FakeControlPlane, read_wal

CHILD = CRASHING_AGENT_PRELUDE + textwrap.dedent(
    """
    wal = sp.WAL(wal_path)
    with sp.saga(name="first", wal=wal):
        ok(1)
    with sp.saga(name="crashing", wal=wal):
        ok(2)
        doomed(3)
    """
)


def test_sigkill_after_effect_before_commit_leaves_a_verifiable_wal(tmp_path: Any) -> None:
    wal_path = tmp_path / "agent.wal"
    effect = tmp_path / "effect.txt"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(wal_path), str(effect), str(write_fd)], pass_fds=(write_fd,)
    )
    os.close(write_fd)
    try:
        assert os.read(read_fd, 1) == b"E"  # blocks until the effect has happened
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        os.close(read_fd)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    assert effect.read_text() == "charged 3"

    records = read_wal(wal_path)
    assert verify_chain(records).intact and integrity.verify(records).intact
    crashing = [r for r in records if r.get("saga_id", "").startswith("crashing")]
    assert [r["event"] for r in crashing] == ["SAGA_START", "STEP_INTENT", "STEP_COMMITTED", "STEP_INTENT"]
    intent = crashing[-1]
    assert (
        intent["tool"] == "charge"
        and intent["kwargs"] == {"amount": 3}
        and intent["semantics"] == "COMPENSABLE"
    )

    # A new process ships it; the control plane holds every record exactly once, in order.
    server = FakeControlPlane()
    try:
        env = {**os.environ, "SAGAPLANE_URL": server.url, "SAGAPLANE_API_KEY": API_KEY}
        out = subprocess.run(
            [sys.executable, "-m", "sagaplane", "ship", str(wal_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        stream = (tmp_path / "agent.wal.meta.json").read_text()
        stream_id = next(s for s in server.streams)
        assert stream_id in stream
        assert server.records(stream_id) == records
        # Shipping again is a no-op: the cursor remembers.
        again = subprocess.run(
            [sys.executable, "-m", "sagaplane", "ship", str(wal_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 0 and "shipped 0 record(s)" in again.stdout
        assert server.records(stream_id) == records
    finally:
        server.close()

    # And the restarted writer continues the same chain.
    import sagaplane as sp

    with sp.WAL(wal_path) as wal:
        wal.append("SAGA_START", {"saga_id": "after-restart", "pid": os.getpid(), "lease_ttl": 30.0})
    after = read_wal(wal_path)
    assert after[-1]["_ph"] == records[-1]["_h"] and after[-1]["seq"] == records[-1]["seq"] + 1
    assert verify_chain(after).intact
