"""64 concurrent clients in 4 processes, each spending 999 against a cap of 50,000: exactly 50 are
allowed and the ledger holds exactly 50 × 999, on Redis, on Postgres and on embedded SQLite (on a
loaded machine the gate may refuse a few for its store instead, fail closed: then fewer, never more)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from fleet import services
from fleet.models import Decision, GateDecision
from tenants import services as tenant_services
from tenants.scoping import tenant_context
from tests.hostile.production import own_redis

ROOT = Path(__file__).resolve().parents[2]
PROCESSES, THREADS, AMOUNT, CAP = 4, 16, 999, 50_000
WORKER_DEADLINE = 240


def _run_clients(env: dict[str, str], config: dict[str, Any]) -> list[dict[str, Any]]:
    """Start PROCESSES workers, release them together once all are ready, collect every answer."""
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fleet.gate_worker",
                "run",
                json.dumps({**config, "prefix": f"p{n}"}),
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(PROCESSES)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            line = worker.stdout.readline()
            assert line.strip() == "ready", worker.stderr.read() if worker.stderr else line
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        answers: list[dict[str, Any]] = []
        for worker in workers:
            out, err = worker.communicate(timeout=WORKER_DEADLINE)
            assert worker.returncode == 0, err[-3000:]
            answers += json.loads(out.strip().splitlines()[-1])
        return answers
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def _child_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL", "PYTEST_CURRENT_TEST")
    }
    env.update(DB_POOL_MAX_SIZE=str(THREADS), PYTHONPATH=str(ROOT), **extra)
    return env


def _test_database_url() -> str:
    s = connection.settings_dict
    return (
        f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    )


def _assert_exactly_fifty(answers: list[dict[str, Any]]) -> int:
    """Every call answered; never more than 50 allowed; exactly 50 unless the gate refused some
    for its store (`limit_store_unavailable`: on a loaded machine a debit whose ledger row commits
    after `commit_deadline_ms` is refused and stays debited, erring toward refusal), and then 50
    less those. Returns how many were allowed."""
    assert len(answers) == PROCESSES * THREADS
    allowed = [a for a in answers if a["decision"] == "allow"]
    refused = [a for a in answers if a["decision"] != "allow"]
    reasons = {a["reason"] for a in refused}
    assert reasons <= {"budget_exceeded", "limit_store_unavailable"}, [
        a for a in refused if a["reason"] not in ("budget_exceeded", "limit_store_unavailable")
    ]
    unavailable = sum(a["reason"] == "limit_store_unavailable" for a in refused)
    assert CAP // AMOUNT - unavailable <= len(allowed) <= CAP // AMOUNT == 50
    assert len({a["authorization_id"] for a in allowed}) == len(allowed)
    return len(allowed)


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("store", ["redis", "database"])
def test_64_clients_in_4_processes_never_overspend_on_postgres(
    transactional_db: None, tmp_path: Path, store: str
) -> None:
    tenant = tenant_services.create_tenant("gate-race", "Gate race", "owner@race.example", actor="test")
    services.create_budget(tenant, actor="test", name="fleet", tool="stripe.*", max_total=CAP, window_s=86400)
    config: dict[str, Any] = {"tenant": "gate-race", "threads": THREADS, "calls": 1, "amount": AMOUNT}
    env = _child_env(DATABASE_URL=_test_database_url(), SAGAPLANE_GATE_STORE="database")
    if store == "redis":
        with own_redis(tmp_path) as server:
            config["redis_url"] = server.url
            env["REDIS_URL"] = server.url
            answers = _run_clients(env, config)
    else:
        answers = _run_clients(env, config)
    allowed = _assert_exactly_fifty(answers)
    with tenant_context(tenant):
        ledger = list(GateDecision.objects.filter(decision=Decision.ALLOW).values_list("debits", flat=True))
    assert len(ledger) == allowed and sum(int(d[0]["amount"]) for d in ledger) == allowed * AMOUNT * 10_000


@pytest.mark.slow
def test_64_clients_in_4_processes_never_overspend_on_embedded_sqlite(tmp_path: Path) -> None:
    env = _child_env(SAGAPLANE_DATA_DIR=str(tmp_path), SAGAPLANE_GATE_STORE="database")
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
    answers = _run_clients(env, {"tenant": "lite", "threads": THREADS, "calls": 1, "amount": AMOUNT})
    _assert_exactly_fifty(answers)
