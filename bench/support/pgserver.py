"""A Postgres server of the benchmark's own, configured the way a production server is.

The machine's shared Postgres is a development server (128 MiB of shared_buffers, autovacuum off
on this machine), and a benchmark that grows a tenant to ten million records would fill it with
16 GB. What a tenant meets in production is a server sized for its working set, with autovacuum
on. So the scale benchmark starts its own: `initdb` into a folder it keeps between runs (a run
continues growing what the last one grew), `pg_ctl` on a port of its own, Postgres' own sizing
guidance (shared_buffers a quarter of the memory, effective_cache_size half of it), autovacuum
at its defaults, and the two roles of core/rls.py. Stopped when the benchmark ends.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_port

OWNER = "sagaplane_owner"
RUNTIME = "sagaplane"


def _memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def production_settings(memory: int | None = None) -> dict[str, str]:
    """Postgres' documented starting points for a dedicated server of `memory` bytes."""
    mib = (memory or _memory_bytes()) // 2**20
    return {
        "shared_buffers": f"{min(mib // 4, 8192)}MB",
        "effective_cache_size": f"{mib // 2}MB",
        "maintenance_work_mem": f"{min(mib // 16, 1024)}MB",
        "work_mem": "16MB",
        "max_wal_size": "8GB",
        "checkpoint_timeout": "15min",
        "checkpoint_completion_target": "0.9",
        "random_page_cost": "1.1",  # SSD-backed
        "autovacuum": "on",
        "max_connections": "200",
        "listen_addresses": "127.0.0.1",
    }


@dataclass
class PrivateServer:
    folder: Path
    port: int
    settings: dict[str, str]

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @staticmethod
    @functools.cache
    def _bindir() -> Path:
        pg_config = shutil.which("pg_config")
        if pg_config is None:
            raise SystemExit("a private Postgres needs the server binaries (pg_config, initdb, pg_ctl)")
        return Path(
            subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
        )

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self._bindir() / tool), *args]
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            pwd.getpwnam("postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            log = (
                (self.folder / "log").read_text(errors="replace")[-3000:]
                if (self.folder / "log").exists()
                else ""
            )
            raise SystemExit(f"{tool} failed: {result.stdout}{result.stderr}{log}")

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
        if not (self.data / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        elif (self.data / "postmaster.pid").exists():  # left running by a run that was killed
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        options = " ".join(
            [f"-p {self.port}", f"-k {self.folder}"] + [f"-c {k}={v}" for k, v in self.settings.items()]
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.folder / "log"), "-w", "start"
        )
        self._roles()

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def _roles(self) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres", "postgres"), autocommit=True) as c:
            for role, extra in ((OWNER, "CREATEDB"), (RUNTIME, "")):
                if not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone():
                    c.execute(f"CREATE ROLE {role} LOGIN {extra} PASSWORD '{role}'")

    def url(self, role: str, database: str) -> str:
        return f"postgresql://{role}:{role}@127.0.0.1:{self.port}/{database}"

    def environment(self, database: str = "sagaplane") -> dict[str, str]:
        """DATABASE_URL (runtime role) and DATABASE_OWNER_URL for `database` on this server."""
        return {"DATABASE_URL": self.url(RUNTIME, database), "DATABASE_OWNER_URL": self.url(OWNER, database)}


def private_server(folder: Path, memory: int | None = None) -> PrivateServer:
    return PrivateServer(folder, free_port(), production_settings(memory))
