"""Gate clients in processes of their own (tests/fleet/gate_worker.py), for the tests that race them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.db import connection

from tests.support.concurrency import released_together

ROOT = Path(__file__).resolve().parents[2]


PROCESSES, THREADS, AMOUNT, CAP = 4, 16, 999, 50_000
WORKER_DEADLINE = 240


def run_clients(env: dict[str, str], config: dict[str, Any]) -> list[dict[str, Any]]:
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
    return [answer for answers in released_together(workers, WORKER_DEADLINE) for answer in answers]


def child_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL", "PYTEST_CURRENT_TEST")
    }
    env.update(DB_POOL_MAX_SIZE=str(THREADS), PYTHONPATH=str(ROOT), **extra)
    return env


def running_database_url() -> str:
    s = connection.settings_dict
    return (
        f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    )


def assert_exactly_fifty(answers: list[dict[str, Any]]) -> int:
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
