"""The MCP demo agent as `make run` starts it: an MCP client whose calls go through `sagaplane
mcp-gateway` to the example shop, shipping to the real control plane: its rounds are sagas the
control plane holds under the agent's name, committed ones completed and rolled-back ones rolled
back; under the demo's own card budget (seed_demo), which counts every charge and refuses none
for a missing amount."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp

from fleet import services as fleet
from fleet.models import GateDecision
from tenants.actors import user_actor
from tenants.management.commands.seed_demo import DEMO_BUDGET
from tenants.models import Tenant
from tests.support.scoping import in_tenant

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "sdk" / "examples" / "mcp_demo_agent.py"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def test_the_mcp_demo_agent_ships_its_rounds_as_sagas(
    live_server: Any, alice: Any, tenant_a: Tenant, tmp_path: Path
) -> None:
    budget = fleet.BudgetCreate.parse(DEMO_BUDGET)
    in_tenant(fleet.create_budget, tenant_a, budget, actor=user_actor("alice"))
    env = {**os.environ, "SAGAPLANE_URL": live_server.url, "SAGAPLANE_API_KEY": alice.api_key}
    env["SAGAPLANE_WAL_DIR"] = str(tmp_path / "mcp-demo")
    done = subprocess.run(
        [sys.executable, str(DEMO), "--rounds", "4", "--pause", "0", "--seed", "11"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "session closed" and len(lines) == 5, lines
    rounds = dict(line.split(": ", 1) for line in lines[:-1])
    # The gateway flushed its WAL to the control plane before it exited (a clean end of session).
    listing = sp.Client(live_server.url, alice.api_key).get("/api/v1/sagas?limit=100")
    assert listing.status == 200
    held = {s["saga_id"]: s for s in listing.body["results"]}
    assert set(held) == set(rounds)
    for saga_id, outcome in rounds.items():
        expected = "completed" if outcome == "committed" else "rolled_back"
        assert held[saga_id]["status"] == expected, (saga_id, outcome, held[saga_id])
        assert held[saga_id]["agent"] == "mcp-shop-agent"
    assert {"completed", "rolled_back"} <= {s["status"] for s in held.values()}

    decisions = in_tenant(lambda _tenant: list(GateDecision.objects.all()), tenant_a)
    refusals = [(d.tool, d.reason) for d in decisions if d.decision != "allow"]
    assert refusals == []
    assert any(d.tool == "charge_card" for d in decisions)  # the budget saw the charges
