"""The adapters' runnable examples run as documented (local only: no control plane, no model):
the run completes, and with `--fail` the exception rolls the saga back (the charge refunded, the
wire reported as having no inverse)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sagaplane_testkit import read_wal

EXAMPLES = Path(__file__).resolve().parents[2] / "sdk" / "examples"


@pytest.mark.parametrize("example", ["langgraph_agent.py", "openai_agents_agent.py"])
def test_an_adapter_example_completes_and_rolls_back(example: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGAPLANE_")}

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / example), "--dir", str(tmp_path), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    assert run().splitlines() == ["  charge_card(40)", "  wire(40, acme)", "Done: sent 40 to acme"]
    failed = (
        run("--fail", "--amount", "7")
        if "openai" in example
        else run("--fail", "--amount", "7", "--thread", "t2")
    )
    assert failed.splitlines()[:2] == ["  charge_card(7)", "  refund_charge(ch_7)"]
    assert "rolled back" in failed and "1 ORPHANED: wire" in failed
    events = [r["event"] for r in read_wal(tmp_path / "agent.wal")]
    assert events.count("SAGA_COMPLETE") == 1 and events.count("SAGA_ABORTED") == 1
