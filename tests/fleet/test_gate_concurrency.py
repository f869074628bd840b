"""64 concurrent clients in 4 processes, each spending 999 against a cap of 50,000: exactly 50 are
allowed and the ledger holds exactly 50 × 999, on Redis, on Postgres and on embedded SQLite (on a
loaded machine the gate may refuse a few for its store instead, fail closed: then fewer, never more)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from core.scoping import tenant_context
from fleet import services
from fleet.models import Decision, GateDecision
from tenants import founding
from tenants.actors import named_actor
from tests.fleet.concurrency import (
    AMOUNT,
    CAP,
    ROOT,
    THREADS,
    assert_exactly_fifty,
    child_env,
    run_clients,
    running_database_url,
)
from tests.hostile.production import own_redis
from tests.support.scoping import in_tenant


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("store", ["redis", "database"])
def test_64_clients_in_4_processes_never_overspend_on_postgres(
    transactional_db: None, tmp_path: Path, store: str
) -> None:
    tenant = founding.create_tenant("gate-race", "Gate race", "owner@race.example", actor=named_actor("test"))
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse(
            {"name": "fleet", "tool": "stripe.*", "max_total": CAP, "window_s": 86400}
        ),
        actor=named_actor("test"),
    )
    config: dict[str, Any] = {"tenant": "gate-race", "threads": THREADS, "calls": 1, "amount": AMOUNT}
    env = child_env(DATABASE_URL=running_database_url(), SAGAPLANE_GATE_STORE="database")
    if store == "redis":
        with own_redis(tmp_path) as server:
            config["redis_url"] = server.url
            env["REDIS_URL"] = server.url
            answers = run_clients(env, config)
    else:
        answers = run_clients(env, config)
    allowed = assert_exactly_fifty(answers)
    with tenant_context(tenant):
        ledger = list(GateDecision.objects.filter(decision=Decision.ALLOW).values_list("debits", flat=True))
    assert len(ledger) == allowed and sum(int(d[0]["amount"]) for d in ledger) == allowed * AMOUNT * 10_000


@pytest.mark.slow
def test_64_clients_in_4_processes_never_overspend_on_embedded_sqlite(tmp_path: Path) -> None:
    env = child_env(SAGAPLANE_DATA_DIR=str(tmp_path), SAGAPLANE_GATE_STORE="database")
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    setup = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.fleet.gate_worker",
            "setup",
            json.dumps({"tenant": "lite", "max_total": CAP}),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert setup.returncode == 0, setup.stderr[-3000:]
    answers = run_clients(env, {"tenant": "lite", "threads": THREADS, "calls": 1, "amount": AMOUNT})
    assert_exactly_fifty(answers)
