"""A whole deployment of the test's own, for the recovery crash tests: a private Postgres cluster
(initdb / pg_ctl on its own port, so a test may restart it; never the shared server), its own
Redis, the production command serving (gunicorn), a Celery worker with the beat (the lease
sweep, webhook deliveries), and helpers that run agents and recovery workers as real processes
and read the shop's ledger."""

from __future__ import annotations

import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.hostile.production import (
    PROXY_HEADERS,
    ROOT,
    VENV_BIN,
    ControlPlane,
    control_plane,
    manage,
    own_redis,
)
from tests.support.load import cpu_hogs
from tests.support.ports import free_port
from tests.support.prerequisites import unavailable
from tests.support.processes import stop_group
from tests.support.production_env import production_env
from tests.support.waiting import wait_until

DEADLINE = 60.0
AGENT = Path(__file__).with_name("agent.py")
FLOOD = Path(__file__).with_name("flood.py")


def _pg_bin() -> Path:
    found = shutil.which("pg_config")
    if found is None:
        unavailable("Postgres' server binaries (pg_config, initdb, pg_ctl) are not installed")
    out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


@dataclass
class Cluster:
    """A Postgres server of the test's own (trust authentication on loopback only)."""

    folder: Path
    port: int
    bindir: Path
    user: str | None  # the account that runs the server when the tests run as root

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c max_connections=200"
        result = self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.folder / "log"), "-w", "start"
        )
        if result.returncode != 0:
            pytest.fail(f"pg_ctl start failed: {result.stdout}{result.stderr}{self.log_tail()}")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        """An abrupt restart: every connection is cut (immediate shutdown, crash recovery at start)."""
        self.stop("immediate")
        self.start()

    def log_tail(self) -> str:
        try:
            return (self.folder / "log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True
        ) as conn:
            conn.execute(sql)


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    bindir = _pg_bin()
    user = None
    if os.geteuid() == 0:  # initdb refuses to run as root
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            unavailable("running as root needs a 'postgres' account to run a private Postgres")
        user = "postgres"
    folder = Path(tempfile.mkdtemp(prefix="sagaplane-pg-"))
    if user is not None:
        shutil.chown(folder, user)
    cluster = Cluster(folder, free_port(), bindir, user)
    result = cluster._run("initdb", "-D", str(cluster.data), "-A", "trust", "-U", "postgres", "--no-sync")
    if result.returncode != 0:
        pytest.fail(f"initdb failed: {result.stdout}{result.stderr}")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


def _roles() -> tuple[str, str]:
    runtime = urlsplit(os.environ.get("DATABASE_URL", "")).username
    owner = urlsplit(os.environ.get("DATABASE_OWNER_URL", "")).username
    if not runtime or not owner:
        unavailable("needs DATABASE_URL and DATABASE_OWNER_URL (their role names are reused)")
    return runtime, owner


@dataclass
class Deployment:
    cluster: Cluster | None  # None: embedded (SQLite)
    server: ControlPlane
    env: dict[str, str]
    key: str  # ingest, read, recovery, control
    folder: Path
    ledger: Path
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    # -- HTTP -------------------------------------------------------------------------------

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.server.url,
            headers={**PROXY_HEADERS, "Authorization": f"Bearer {self.key}"},
            timeout=30,
        )

    def saga(self, saga_id: str) -> dict[str, Any] | None:
        with self.client() as client:
            response = client.get(f"/api/v1/sagas/{saga_id}")
        return response.json() if response.status_code == 200 else None

    def swept(self) -> bool:
        """Whether the recovery sweep has finished a pass lately (/readyz's detail)."""
        response = httpx.get(f"{self.server.url}/readyz", headers=PROXY_HEADERS, timeout=10)
        detail = response.json().get("detail", {}) if response.status_code == 200 else {}
        return detail.get("recovery_sweep", {}).get("status") == "ok"

    def jobs(self, saga_id: str) -> list[dict[str, Any]]:
        with self.client() as client:
            response = client.get(f"/api/v1/recovery/jobs?saga_id={saga_id}")
        assert response.status_code == 200, response.text
        return response.json()["jobs"]

    # -- processes ----------------------------------------------------------------------------

    def sdk_env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SAGAPLANE_", "DATABASE_"))
        }
        env.update(
            {
                "SAGAPLANE_URL": self.server.url,
                "SAGAPLANE_API_KEY": self.key,
                "SHOP_LEDGER": str(self.ledger),
                "PYTHONPATH": str(ROOT),
                "PYTHONUNBUFFERED": "1",
                **extra,
            }
        )
        return env

    def start(self, command: list[str], log_name: str, **extra_env: str) -> subprocess.Popen[Any]:
        log = (self.folder / log_name).open("w")
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=self.sdk_env(**extra_env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    def agent(self, mode: str, saga_id: str, *args: str, **extra_env: str) -> subprocess.Popen[Any]:
        wal = self.folder / f"{saga_id}.wal"
        return self.start(
            [sys.executable, str(AGENT), mode, saga_id, str(wal), *args], f"agent-{saga_id}.log", **extra_env
        )

    def worker(self, name: str, **extra_env: str) -> subprocess.Popen[Any]:
        return self.start(
            [
                sys.executable,
                "-m",
                "sagaplane",
                "worker",
                "--handlers",
                "tests.recovery.shop",
                "--name",
                name,
                "--lease",
                extra_env.pop("LEASE", "2"),
                "--wait",
                "2",
            ],
            f"worker-{name}.log",
            **extra_env,
        )

    def log(self, name: str) -> str:
        try:
            return (self.folder / name).read_text(errors="replace")
        except OSError:
            return ""

    def tails(self) -> str:
        parts = [
            f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}"
            for p in sorted(self.folder.glob("*.log"))
        ]
        return (
            "\n".join(parts)
            + f"\n--- server\n{self.server.log_tail()}"
            + (f"\n--- postgres\n{self.cluster.log_tail()}" if self.cluster else "")
        )

    def until(self, condition: Callable[[], Any], what: str, deadline: float = DEADLINE) -> Any:
        """Poll `condition` until it returns something truthy, or fail naming `what`."""
        return wait_until(condition, what, deadline=deadline, every=0.1, context=self.tails)

    def sweep_times(self, n: int) -> None:
        """Run the beat's sweep task `n` more times, in a process of its own."""
        manage(
            self.env, "shell", "-c", f"from recovery.tasks import sweep_all\nfor _ in range({n}): sweep_all()"
        )

    # -- the shop's ledger ------------------------------------------------------------------------

    def ledger_rows(self, table: str) -> list[sqlite3.Row]:
        if not self.ledger.exists():
            return []
        with sqlite3.connect(self.ledger, timeout=30) as db:
            db.row_factory = sqlite3.Row
            try:
                return list(db.execute(f"SELECT * FROM {table} ORDER BY rowid"))  # noqa: S608 (fixed names)
            except sqlite3.OperationalError:
                return []

    def refunds(self) -> dict[str, int]:
        """charge id → refunds applied (each idempotency key at most once, as a payment API would)."""
        out: dict[str, int] = {}
        for row in self.ledger_rows("refunds"):
            out[row["charge_id"]] = out.get(row["charge_id"], 0) + 1
        return out

    def attempts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.ledger_rows("attempts"):
            out[row["charge_id"]] = out.get(row["charge_id"], 0) + 1
        return out


# The deployment shapes a saturation test runs in, as fixture params: production's (private
# Postgres and Redis, gunicorn) in the Postgres phase, `make run`'s (SQLite) in the SQLite phase
# (make test's second run, which deselects the Postgres one). Chosen at collection, so neither
# phase collects a shape only to skip it.
_IN_POSTGRES_PHASE = os.environ.get("DATABASE_URL", "").startswith("postgres")
SATURATED_SHAPES = [
    *([] if _IN_POSTGRES_PHASE else ["embedded"]),
    pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.redis]),
]


@contextmanager
def saturated_deployment(shape: str, tmp_path: Path) -> Iterator[Deployment]:
    """A deployment of `shape` (one of SATURATED_SHAPES) with CPU hogs (two per core) and a flood
    of ingest (`flood.py`) into its tenant, yielded once the flood is being stored; every process
    is stopped after."""
    chosen = deployment(tmp_path) if shape == "postgres" else embedded_deployment(tmp_path)
    # SQLite takes one writer at a time: a lighter flood saturates it (and its two workers).
    threads, batch = ("4", "20") if shape == "postgres" else ("2", "5")
    with chosen as live:
        load = cpu_hogs()
        load.append(
            live.start([sys.executable, str(FLOOD), live.server.url, live.key, threads, batch], "flood.log")
        )
        try:
            with live.client() as client:

                def stored() -> bool:
                    answer = client.get("/api/v1/sagas", params={"limit": 1})
                    return answer.status_code == 200 and bool(answer.json().get("results"))

                live.until(stored, "the flood's first sagas")
            yield live
        finally:
            for process in load:
                stop_group(process)


def _with_celery(live: Deployment, name: str) -> Iterator[Deployment]:
    """Start the README's Celery worker with its beat (`worker -B --concurrency=2`, as `make run`
    does), wait until the beat's sweeper has run a pass, yield; then kill every process started."""
    data = Path(live.env["SAGAPLANE_DATA_DIR"])
    celery = subprocess.Popen(
        [
            str(VENV_BIN / "celery"), "-A", "controlplane", "worker", "-B", "--concurrency=2",
            "--loglevel=INFO", "-n", f"{name}@%h", "-s", str(data / "beat-schedule"),
        ],
        cwd=ROOT, env=live.env, stdout=(live.folder / "celery.log").open("w"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    live.processes.append(celery)
    try:
        # The beat's start-up checks come first: begin once its sweeper has run a pass.
        live.until(live.swept, "the beat's first sweep")
        yield live
    finally:
        for process in reversed(live.processes):
            stop_group(process)


def _recovery_key(env: dict[str, str]) -> str:
    out = manage(
        env,
        "create_api_key",
        "--tenant",
        "shop",
        "--name",
        "recovery",
        "--scopes",
        "ingest,read,recovery,control",
    )
    return out.strip().splitlines()[-1]


@contextmanager
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """Production-configured: a private Postgres, its own Redis, gunicorn (2 workers)."""
    runtime, owner = _roles()
    with private_cluster() as cluster, own_redis(tmp_path) as redis:
        cluster.execute(f"CREATE ROLE \"{runtime}\" LOGIN PASSWORD 'x' NOSUPERUSER NOBYPASSRLS")
        cluster.execute(f"CREATE ROLE \"{owner}\" LOGIN PASSWORD 'x' CREATEDB")
        cluster.execute(f'CREATE DATABASE sagaplane OWNER "{owner}"')
        database_url = f"postgres://{runtime}:x@127.0.0.1:{cluster.port}/sagaplane"
        data = tmp_path / "data"
        data.mkdir()
        env = production_env(
            database_url,
            redis.url,
            data,
            LOG_LEVEL="INFO",
            SAGAPLANE_PUBLIC_URL="https://127.0.0.1",
            SECURE_SSL_REDIRECT="false",  # the SDK processes speak plain http on loopback
            SAGAPLANE_WEBHOOK_ALLOW_PRIVATE="true",  # the test webhook receivers listen on loopback
        )
        with control_plane(env, workers=2, tenant="shop") as server:
            folder = tmp_path / "run"
            folder.mkdir()
            live = Deployment(cluster, server, env, _recovery_key(env), folder, folder / "ledger.sqlite3")
            yield from _with_celery(live, f"recovery-{cluster.port}")


@contextmanager
def embedded_deployment(tmp_path: Path) -> Iterator[Deployment]:
    """`make run`'s shape (infra/run-embedded.sh): SQLite, the filesystem broker, the in-memory
    channel layer, `manage.py runserver` and `celery worker -B --concurrency=2`."""
    data = tmp_path / "data"
    data.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "SAGAPLANE_", "DB_"))
        and k not in ("DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL")
    }
    env.update({"SAGAPLANE_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "INFO"})
    manage(env, "migrate", "--noinput", "-v0")
    manage(
        env, "create_tenant", "shop", "--name", "Shop", "--owner-email", "owner@shop.example",
        "--owner-password", "embedded-owner-password",
    )  # fmt: skip
    key = _recovery_key(env)
    port = free_port()
    folder = tmp_path / "run"
    folder.mkdir()
    log = folder / "runserver.log"
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    server = ControlPlane(f"http://127.0.0.1:{port}", key, process, log)
    live = Deployment(None, server, env, key, folder, folder / "ledger.sqlite3", [process])

    def serving() -> bool:
        try:
            return httpx.get(f"{server.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    live.until(serving, "runserver to answer")
    yield from _with_celery(live, f"embedded-{port}")


def records(live: Deployment, saga_id: str, event: str) -> list[dict[str, Any]]:
    saga = live.saga(saga_id) or {"records": []}
    return [r["record"] for r in saga["records"] if r["stream"] == "server" and r["record"]["event"] == event]


def committed(live: Deployment, saga_id: str, steps: int) -> bool:
    saga = live.saga(saga_id)
    return saga is not None and [s["status"] for s in saga["steps"]] == ["committed"] * steps
