"""Zero overspend on leases: 64 agents in 4 processes spend one budget on leases (per call once
little is left) while one process is SIGKILLed holding leases and Redis is killed and restarted
empty; every effect any agent performed (written before it "happened") adds up to at most the cap,
and the ledger counts at least what was performed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core.scoping import tenant_context
from fleet import services
from fleet.models import BudgetLimit, Decision, GateDecision, GateLease
from tenants import founding
from tenants.actors import named_actor
from tests.fleet.concurrency import ROOT, child_env, running_database_url
from tests.hostile.production import OwnRedis, own_redis
from tests.support.scoping import in_tenant
from tests.support.waiting import wait_until

PROCESSES, THREADS, AMOUNT, CAP = 4, 16, 999, 50_000


def _start(env: dict[str, str], config: dict[str, object], n: int, effects: Path) -> subprocess.Popen[str]:
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fleet.lease_worker",
            json.dumps({**config, "prefix": f"p{n}", "effects": str(effects)}),
        ],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    line = worker.stdout.readline()
    assert line.strip() == "ready", worker.stderr.read() if worker.stderr else line
    return worker


def _performed(files: list[Path]) -> int:
    return sum(int(line) for f in files if f.exists() for line in f.read_text().split())


def _race(tmp_path: Path, env: dict[str, str], config: dict[str, object], redis: OwnRedis | None) -> int:
    files = [tmp_path / f"effects-{n}" for n in range(PROCESSES)]
    workers = [_start(env, config, n, files[n]) for n in range(PROCESSES)]
    try:
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        # Some spending under way, then a process dies holding what it holds.
        wait_until(lambda: _performed(files) >= 5 * AMOUNT, "the agents to start spending")
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(timeout=30)
        if redis is not None:
            redis.restart()  # killed by PID, back empty: rebuilt from the ledger
        for worker in workers[1:]:
            out, err = worker.communicate(timeout=240)
            assert worker.returncode == 0, err[-3000:]
            counts = json.loads(out.strip().splitlines()[-1])
            # Each process was answered by the gate (a lease, an allow, or the budget spent): how
            # much of the budget a process got before the others had it depends on scheduling.
            assert counts["leases"] + counts["per_call"] + counts["refused"] > 0, counts
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    return _performed(files)


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("store", ["redis", "database"])
def test_64_agents_on_leases_never_overspend_through_kills_and_a_redis_restart(
    transactional_db: None, tmp_path: Path, store: str
) -> None:
    tenant = founding.create_tenant(
        "lease-race", "Lease race", "owner@race.example", actor=named_actor("test")
    )
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse(
            {"name": "fleet", "tool": "stripe.*", "max_total": CAP, "window_s": 86400}
        ),
        actor=named_actor("test"),
    )
    config: dict[str, object] = {"tenant": "lease-race", "threads": THREADS, "amount": AMOUNT}
    env = child_env(DATABASE_URL=running_database_url(), SAGAPLANE_GATE_STORE="database")
    if store == "redis":
        with own_redis(tmp_path) as server:
            config["redis_url"] = server.url
            env["REDIS_URL"] = server.url
            performed = _race(tmp_path, env, config, server)
    else:
        performed = _race(tmp_path, env, config, None)
    assert 0 < performed <= CAP
    with tenant_context(tenant):
        leases = list(GateLease.objects.all())
        per_call = GateDecision.objects.filter(decision=Decision.ALLOW).count()
        usage = services.budget_usage(BudgetLimit.objects.get(name="fleet"))
    assert leases, "no lease was granted"
    counted = sum(max(lease.counted()) for lease in leases) + per_call * AMOUNT * 10_000
    # The ledger counts every effect performed (and a dead process' leases whole), never past the cap.
    assert performed * 10_000 <= counted <= CAP * 10_000
    assert int(float(usage[0]["used"]) * 10_000) == counted
