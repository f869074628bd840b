"""Two approvers in two processes cast the last required vote at once, and each process then asks
the gate for the approved call (with its own idempotency key, as two agents would): the request is
approved once and the effect authorised once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from approvals.models import ApprovalRequest, Status
from core.scoping import tenant_context
from fleet.models import Decision, GateDecision
from tests.support.approvals import Agent, vote, wire_policy
from tests.support.chains import server_stream
from tests.support.concurrency import released_together
from tests.support.factories import Person

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120


def _env() -> dict[str, str]:
    s = connection.settings_dict
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "DATABASE_OWNER_URL", "PYTEST_CURRENT_TEST")
    }
    env["DATABASE_URL"] = (
        f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    )
    env.update(PYTHONPATH=str(ROOT), SAGAPLANE_GATE_STORE="database")
    return env


@pytest.mark.postgres
@pytest.mark.parametrize("round_", range(3))
def test_two_last_votes_racing_from_two_processes_approve_once_and_authorise_once(
    transactional_db: None, agent: Agent, alice: Person, ann: Person, ben: Person, adam: Person, round_: int
) -> None:
    wire_policy(agent.tenant, required_approvals=2)
    pending = agent.ask(amount=100, saga="race")
    vote(ann, pending["approval_id"])
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.approvals.race_worker",
                json.dumps(
                    {
                        "tenant": agent.tenant.slug,
                        "approval_id": pending["approval_id"],
                        "email": person.user.email,
                        "prefix": agent.prefix,
                        "saga": "race",
                        "amount": 100,
                        "key": f"agent-{n}",
                    }
                ),
            ],
            cwd=ROOT,
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n, person in enumerate((ben, adam))
    ]
    results = released_together(workers, DEADLINE_S)
    assert sorted(r["vote"] for r in results) == ["already_decided", "approved"]
    gates = [r["gate"] for r in results]
    allowed = [g for g in gates if g["decision"] == "allow"]
    assert len(allowed) == 1, gates
    assert [g["reason"] for g in gates if g["decision"] != "allow"] == ["approval_consumed"]
    with tenant_context(agent.tenant):
        row = ApprovalRequest.objects.get(pk=pending["approval_id"])
        assert row.status == Status.CONSUMED and row.approvals == 2
        assert row.authorization_id == allowed[0]["authorization_id"]
        assert GateDecision.objects.filter(saga_id="race", decision=Decision.ALLOW).count() == 1
    events = [r["event"] for r in server_stream(alice.tenant)]
    assert events.count("APPROVAL_GRANTED") == 1 and events.count("APPROVAL_CONSUMED") == 1
