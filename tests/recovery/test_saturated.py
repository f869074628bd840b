"""Takeover that cannot starve (issue 23): with the Celery workers saturated (a flood of ingest
keeping integration and sealing busy, and CPU hogs on every core), agents SIGKILLed mid-saga are
still taken over within seconds of their lease's expiry, then compensated once each.

The sweep used to be a beat message that expired after 2 s in the queue every worker shares:
behind busy workers it never ran and the dead agents' sagas stayed `running`. Both deployment
shapes: `make run`'s (SQLite, filesystem broker, `runserver`, `worker -B --concurrency=2`) and
production's (private Postgres and Redis, gunicorn). No recovery worker runs until every saga is
taken over, so the sweep alone must do it (a worker's claim would take them over by itself)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.recovery.live import SATURATED_SHAPES, Deployment, committed, records, saturated_deployment
from tests.support.processes import stop_group

LEASE_TTL = 3.0
AGENTS = 3
CHARGES = 2
# Taking over must not wait for the flood to end; the deadline only bounds a failing run.
TAKEOVER_DEADLINE = 60.0


pytestmark = pytest.mark.slow


@pytest.fixture(params=SATURATED_SHAPES)
def saturated(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    with saturated_deployment(request.param, tmp_path) as live:
        yield live


def test_killed_agents_are_taken_over_while_the_workers_are_saturated(saturated: Deployment) -> None:
    live = saturated
    agents = {}
    for n in range(1, AGENTS + 1):
        saga_id = f"saturated-{n}"
        agents[saga_id] = live.agent("hang", saga_id, str(CHARGES), str(LEASE_TTL))
    for saga_id, agent in agents.items():
        live.until(lambda s=saga_id: committed(live, s, CHARGES), f"{saga_id}'s commits", deadline=120)
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=30)

    # No recovery worker yet: the sweep alone takes them over, however busy the workers are.
    for saga_id in agents:
        jobs = live.until(
            lambda s=saga_id: live.jobs(s),
            f"{saga_id} to be taken over with the workers saturated",
            deadline=LEASE_TTL + TAKEOVER_DEADLINE,
        )
        assert [job["state"] for job in jobs] == ["pending"] * CHARGES, jobs
        live.until(lambda s=saga_id: records(live, s, "RECOVERY_STARTED"), f"{saga_id}'s RECOVERY_STARTED")
        live.until(
            lambda s=saga_id: (live.saga(s) or {}).get("saga", {}).get("status") == "recovering",
            f"{saga_id} shown recovering",
        )

    worker = live.worker("w-saturated")
    try:
        charges = [f"{saga_id}-ch{n}" for saga_id in agents for n in range(1, CHARGES + 1)]
        live.until(
            lambda: all(live.refunds().get(charge) == 1 for charge in charges),
            "every charge refunded",
            deadline=120,
        )
        assert all(live.refunds()[charge] == 1 for charge in charges), live.refunds()
        # A refund is made before its worker reports the job done: wait for the reports.
        for saga_id in agents:
            live.until(
                lambda s=saga_id: {job["state"] for job in live.jobs(s)} == {"compensated"},
                f"{saga_id}'s jobs reported compensated",
            )
        assert all(live.refunds()[charge] == 1 for charge in charges), live.refunds()  # none twice
    finally:
        stop_group(worker)
