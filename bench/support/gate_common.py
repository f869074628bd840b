"""The gate benchmark's shared parts (bench/gate.py): statistics, its own Redis and database, the
measured runs' tenants and limits, and clients as threads."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tenants.actors import system_actor

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sdk"))

from tests.support.ports import free_port  # noqa: E402
from tests.support.probes import redis_answers  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

perf = time.perf_counter
AMOUNT = 999
HUGE_CAP = 10**9
WINDOW_S = 86_400
CLIENTS = (1, 16, 64)
LIMIT_COUNTS = (1, 5)
TARGET_INPROC_P99_MS = 1.0
TARGET_P99_VS_FLOOR = 3.0
TARGET_HTTP_PER_S = 2_000


def evaluate_scoped(tenant: Any, request: Any, **options: Any) -> dict[str, Any]:
    """`fleet.services.evaluate` as the gate's fast route calls it (controlplane/gate_asgi.py): the
    tenant entered statement-scoped, no transaction (the decision's lean path on Redis)."""
    from core.scoping import tenant_statements
    from fleet import services

    with tenant_statements(tenant):
        return services.evaluate(tenant, request, **options)


# ------------------------------------------------------------------------------------------- stats


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


def _summary(latencies_s: list[float], wall_s: float) -> dict[str, Any]:
    ms = [x * 1000 for x in latencies_s]
    return {
        "decisions": len(ms),
        "seconds": round(wall_s, 3),
        "decisions_per_s": round(len(ms) / wall_s, 1),
        "p50_ms": round(_pct(ms, 50), 3),
        "p99_ms": round(_pct(ms, 99), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


def _show(label: str, row: dict[str, Any]) -> None:
    limits = f", {row['limits']} limit(s)" if "limits" in row else ""
    print(
        f"{label:19} {row['clients']:2} clients{limits:13}: {row['decisions_per_s']:9.0f}/s  "
        f"p50 {row['p50_ms']:7.3f} ms  p99 {row['p99_ms']:7.3f} ms"
    )


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("inf")


def _overspend_check(allowed: int, total: int, cap_units: int, ledger_units: int | None = None) -> dict:
    """Every run spends AMOUNT per call against a cap of AMOUNT x total/2: exactly total/2 fit."""
    spent = allowed * AMOUNT
    cap = cap_units
    check = {
        "allowed": allowed,
        "denied": total - allowed,
        "spent": spent,
        "cap": cap,
        "expected_allowed": cap // AMOUNT,
        "overspend": max(0, spent - cap),
    }
    if ledger_units is not None:
        check["ledger_spent"] = ledger_units
        check["overspend"] = max(check["overspend"], ledger_units - cap)
    if check["overspend"] or allowed != cap // AMOUNT or (ledger_units is not None and ledger_units != spent):
        raise SystemExit(f"budget not held exactly: {check}")
    return check


# ---------------------------------------------------------------------------------- own services


@contextmanager
def private_redis(folder: Path) -> Iterator[str]:
    """A redis-server of the benchmark's own (no persistence), killed at the end."""

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (the benchmark starts its own Redis)")
    port = free_port()
    work = folder / f"redis-{port}"
    work.mkdir(parents=True)
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until(
            lambda: redis_answers(url), f"redis-server on port {port} to start", deadline=30, alive=process
        )
        yield url
    finally:
        process.kill()
        process.wait(timeout=30)


def _bench_database_urls(url: str, owner_url: str) -> tuple[str, str]:
    """(DATABASE_URL, DATABASE_OWNER_URL) of the database `<name>_bench_gate`, created by the owner
    role if missing: the benchmark's tenants and decisions stay out of the database the URLs name."""
    import psycopg

    if not owner_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit(
            "set DATABASE_OWNER_URL (the owner role) beside DATABASE_URL, as infra/services.sh does"
        )
    name = f"{urllib.parse.urlsplit(url).path.lstrip('/') or 'sagaplane'}_bench_gate"

    def beside(base: str) -> str:
        return urllib.parse.urlunsplit(urllib.parse.urlsplit(base)._replace(path=f"/{name}"))

    admin = urllib.parse.urlsplit(owner_url.replace("postgres://", "postgresql://", 1))
    with psycopg.connect(urllib.parse.urlunsplit(admin._replace(path="/postgres")), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    return beside(url), beside(owner_url)


# ----------------------------------------------------------------------------------- the policies


class Run:
    """One measured run's tenant, keys and limits: a fleet budget that exactly `total / 2` calls
    exhaust, plus (with 5 limits) budgets per currency and per agent and two rate limits that
    never refuse but must be checked and debited on every call."""

    def __init__(self, limits: int, total: int, *, keys: bool = False) -> None:
        """`limits`: 1 or 5 (0: none, a tenant and its keys only)."""
        from core.scoping import tenant_context
        from fleet import services
        from tenants import founding
        from tenants import services as tenant_services

        self.total = total
        self.cap = AMOUNT * (total // 2)
        slug = f"gate-{uuid.uuid4().hex[:10]}"
        self.tenant = founding.create_tenant(
            slug, "Gate bench", f"owner@{slug}.example", actor=system_actor("bench")
        )
        # The fleet's and the tenant's services assert the tenant's scope: the bench enters it, as
        # a command would, around its set-up (one transaction, committed before the run).
        with tenant_context(self.tenant):
            if limits == 5:
                for name, per in (("per-currency", ["arg:currency"]), ("per-agent", ["agent"])):
                    services.create_budget(
                        self.tenant,
                        services.BudgetCreate.parse(
                            {
                                "name": name,
                                "tool": "bench.*",
                                "max_total": HUGE_CAP,
                                "window_s": WINDOW_S,
                                "per": per,
                            }
                        ),
                        actor=system_actor("bench"),
                    )
            if limits:
                # Created last of the budgets: a refusal comes after the others were checked.
                services.create_budget(
                    self.tenant,
                    services.BudgetCreate.parse(
                        {"name": "fleet", "tool": "bench.*", "max_total": self.cap, "window_s": WINDOW_S}
                    ),
                    actor=system_actor("bench"),
                )
            if limits == 5:
                for name, per in (("calls", []), ("per-tool-calls", ["tool"])):
                    services.create_rate_limit(
                        self.tenant,
                        services.RateLimitCreate.parse(
                            {
                                "name": name,
                                "tool": "bench.*",
                                "max_calls": HUGE_CAP,
                                "window_s": WINDOW_S,
                                "per": per,
                            }
                        ),
                        actor=system_actor("bench"),
                    )
            self.gate_key = self.control_key = ""
            if keys:
                _, self.gate_key = tenant_services.create_api_key(
                    self.tenant,
                    tenant_services.NewApiKey(name="agent", scopes=["gate"]),
                    actor=system_actor("bench"),
                )
                _, self.control_key = tenant_services.create_api_key(
                    self.tenant,
                    tenant_services.NewApiKey(name="operator", scopes=["control"]),
                    actor=system_actor("bench"),
                )

    def ledger_spent(self) -> int:
        """What the durable ledger says was authorised against the fleet budget (whole units)."""
        from core.scoping import tenant_context
        from fleet.gate import SCALE
        from fleet.models import Decision, GateDecision

        with tenant_context(self.tenant):
            rows = GateDecision.objects.filter(decision=Decision.ALLOW).values_list("debits", flat=True)
            units = sum(int(d["amount"]) for debits in rows for d in debits if d["limit"] == "fleet")
        return units // SCALE


def _call_args(client: int) -> dict[str, Any]:
    return {"amount": AMOUNT, "currency": "EUR" if client % 2 else "USD"}


def _threads(
    clients: int, per_client: int, work: Callable[[int, int], bool], after: Callable[[], None] | None = None
) -> tuple[list[float], int, float]:
    """`clients` threads each timing `per_client` calls of work(client, i) -> allowed; `after` runs
    after each call, outside its time (what the end of a request does)."""
    latencies: list[float] = []
    allowed = 0
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    failures: list[BaseException] = []

    def client(n: int) -> None:
        nonlocal allowed
        mine: list[float] = []
        ok = 0
        start.wait()
        try:
            for i in range(per_client):
                t0 = perf()
                if work(n, i):
                    ok += 1
                mine.append(perf() - t0)
                if after is not None:
                    after()
        except BaseException as exc:  # a failed client fails the run (below), not a thread silently
            failures.append(exc)
        with lock:
            latencies.extend(mine)
            allowed += ok

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    t0 = perf()
    for thread in threads:
        thread.join()
    wall = perf() - t0
    if failures:
        raise SystemExit(f"{len(failures)} client(s) failed, first: {failures[0]!r}")
    return latencies, allowed, wall
