"""bench/recovery.py's own services and measurements: a database of its own beside DATABASE_URL's,
a private Redis, the production server (gunicorn, 2 uvicorn workers) and the CPU each role used."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.gunicorn import gunicorn as serve
from tests.support.production_env import production_env

ROOT = Path(__file__).resolve().parent.parent.parent


def bench_database_urls() -> tuple[str, str]:
    import psycopg

    url, owner = os.environ.get("DATABASE_URL", ""), os.environ.get("DATABASE_OWNER_URL", "")
    if not url.startswith(("postgres://", "postgresql://")) or not owner.startswith(
        ("postgres://", "postgresql://")
    ):
        raise SystemExit("set DATABASE_URL and DATABASE_OWNER_URL (Postgres), as infra/services.sh does")
    name = f"{urllib.parse.urlsplit(url).path.lstrip('/') or 'sagaplane'}_bench_recovery"
    admin = urllib.parse.urlsplit(owner.replace("postgres://", "postgresql://", 1))
    with psycopg.connect(urllib.parse.urlunsplit(admin._replace(path="/postgres")), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')

    def swap(base: str) -> str:
        return urllib.parse.urlunsplit(urllib.parse.urlsplit(base)._replace(path=f"/{name}"))

    return swap(url), swap(owner)


def server_env(db_url: str, redis_url: str, data_dir: Path) -> dict[str, str]:
    """The production configuration (tests/support/production_env.py) with this process' keys and
    no redirect."""
    return production_env(
        db_url,
        redis_url,
        data_dir,
        SECRET_KEY=os.environ["SECRET_KEY"],
        SAGAPLANE_MASTER_KEY=os.environ["SAGAPLANE_MASTER_KEY"],
        SECURE_SSL_REDIRECT="0",
    )


_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stats() -> dict[int, tuple[int, float, str]]:
    """pid -> (parent pid, CPU seconds so far, command line) of every process we may read."""
    out: dict[int, tuple[int, float, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS, cmdline)
    return out


def cpu_by_role(server_pid: int, worker_pids: list[int], database: str) -> dict[str, float]:
    """CPU seconds used so far by the control plane (gunicorn and its workers), the recovery
    workers, and the Postgres backends serving `database` (their process titles name it)."""
    stats = _proc_stats()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = [], [server_pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return {
        "server": sum(stats[p][1] for p in tree if p in stats),
        "workers": sum(stats[p][1] for p in worker_pids if p in stats),
        "postgres": sum(
            cpu for _, cpu, cmd in stats.values() if cmd.startswith("postgres: ") and f" {database} " in cmd
        ),
    }


@contextmanager
def gunicorn(env: dict[str, str], log: Path) -> Iterator[tuple[str, int]]:
    with serve(env, log, stop_grace_s=20) as (url, process):
        yield url, process.pid
