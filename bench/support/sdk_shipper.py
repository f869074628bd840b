"""bench/sdk.py's shipper throughput: the SDK's default Shipper to a local control plane (uvicorn,
2 workers, a temp data folder; tenant and key made with the management commands), on Postgres
(+ Redis) when DATABASE_URL (REDIS_URL) is set and always embedded (SQLite)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import sagaplane as sp
from sagaplane.segments import disk_usage

from tests.support.ports import free_port
from tests.support.probes import healthy
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
perf = time.perf_counter
STEPS_PER_SAGA = 10
SHIP_REV = sp.tool(lambda x: x, name="ship_rev", semantics=sp.REVERSIBLE)


# -- shipper -------------------------------------------------------------------------------------------------


def _manage(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout


def _bench_database_urls(url: str, owner_url: str) -> tuple[str, str]:
    """(DATABASE_URL, DATABASE_OWNER_URL) of the database `<name>_bench_sdk`, created by the owner
    role if missing (core/rls.py: the owner migrates and owns it, the runtime role serves): the
    benchmark's tenants and records stay out of the database the URLs name."""
    import psycopg

    def beside(base: str) -> str:
        parsed = urllib.parse.urlsplit(base)
        return urllib.parse.urlunsplit(parsed._replace(path=f"/{name}"))

    if not owner_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit(
            "set DATABASE_OWNER_URL (the owner role) beside DATABASE_URL, as infra/services.sh does"
        )
    name = f"{urllib.parse.urlsplit(url).path.lstrip('/') or 'sagaplane'}_bench_sdk"
    admin = urllib.parse.urlsplit(owner_url.replace("postgres://", "postgresql://", 1))
    with psycopg.connect(urllib.parse.urlunsplit(admin._replace(path="/postgres")), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    return beside(url), beside(owner_url)


def shipper_modes() -> list[tuple[str, dict[str, str]]]:
    """The control planes to ship to: production-like (uvicorn workers on Postgres, with Redis when
    REDIS_URL is set) when DATABASE_URL is set, and always the embedded one (SQLite, no Redis)."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SAGAPLANE_URL", "SAGAPLANE_API_KEY", "DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL")
    }
    base.update({"DJANGO_SETTINGS_MODULE": "controlplane.settings", "DEBUG": "0", "LOG_LEVEL": "WARNING"})
    modes = []
    if os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        runtime_url, owner_url = _bench_database_urls(
            os.environ["DATABASE_URL"], os.environ.get("DATABASE_OWNER_URL", "")
        )
        env = {**base, "DATABASE_URL": runtime_url, "DATABASE_OWNER_URL": owner_url}
        if os.environ.get("REDIS_URL"):
            env["REDIS_URL"] = os.environ["REDIS_URL"]
        modes.append(("postgres+redis" if "REDIS_URL" in env else "postgres", env))
    modes.append(("embedded", base))
    return modes


def shipper_throughput(
    folder: Path, n_records: int, mode: str, env: dict[str, str], workers: int = 2
) -> dict[str, Any]:
    folder = folder / f"ship-{mode}"
    folder.mkdir()
    env = {**env, "SAGAPLANE_DATA_DIR": str(folder / "cp-data")}
    slug = f"bench-{os.getpid()}-{int(time.time())}"
    t = perf()
    _manage(env, "migrate", "--noinput", "-v0")
    _manage(env, "create_tenant", slug, "--name", "Bench", "--owner-email", f"owner@{slug}.example")
    key = _manage(env, "create_api_key", "--tenant", slug, "--name", "bench", "--scopes", "ingest,read")
    key = key.strip().splitlines()[-1]
    setup_s = perf() - t

    # A realistic WAL: sagas of REVERSIBLE steps (written without fsync: we time shipping, not writing).
    wal = sp.WAL(folder / "ship.wal", fsync=False)
    try:
        while wal.seq < n_records:
            with sp.saga(name="ship", wal=wal):
                for i in range(STEPS_PER_SAGA):
                    SHIP_REV(i)
        records = wal.seq
        head = wal.head
        stream_id = wal.stream_id
    finally:
        wal.close()
    size = disk_usage(folder / "ship.wal")  # the live file and the segments it rolled over to

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "controlplane.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--lifespan",
            "off",
            "--no-access-log",
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: healthy(url), "the control plane to start", deadline=120, alive=server)
        shipper = sp.Shipper(folder / "ship.wal", url=url, api_key=key)  # the SDK's defaults
        t = perf()
        shipped = shipper.run_until_caught_up(max_retries=5)
        elapsed = perf() - t
        connections = shipper.client.connections_opened
        stream = sp.Client(url, key).stream(stream_id).body
        assert shipped == records and stream["length"] == records and stream["head"]["hash"] == head, stream
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(30)
    backend = {"embedded": "sqlite (embedded)", "postgres": "postgres", "postgres+redis": "postgres + redis"}[
        mode
    ]
    return {
        "mode": mode,
        "backend": backend,
        "uvicorn_workers": workers,
        "records": records,
        "bytes": size,
        "batch_size": shipper.batch_size,
        "max_batch_bytes": shipper.max_batch_bytes,
        "http_connections": connections,
        "seconds": round(elapsed, 3),
        "records_per_s": round(records / elapsed, 1),
        "mb_per_s": round(size / elapsed / 1e6, 2),
        "setup_seconds": round(setup_s, 1),
        "verified_on_server": True,
    }
