"""Real processes for the fault and load tests: a Redis of the test's own (so it can be killed),
a Postgres database of the test's own (created by the owner role beside DATABASE_URL's, migrated
by it with DATABASE_OWNER_URL, dropped afterwards), and the README's production command serving
them as the runtime role (DATABASE_URL only, as in production):

    gunicorn controlplane.asgi:application -k uvicorn.workers.UvicornWorker

with SAGAPLANE_ENV=production and every required setting. Clients speak plain http on loopback
with `X-Forwarded-Proto: https`, as a TLS-terminating proxy in front of the replicas would."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from sagaplane.chain import GENESIS, stamp

from tests.support.gunicorn import gunicorn
from tests.support.ports import free_port
from tests.support.prerequisites import unavailable
from tests.support.probes import redis_answers
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
STARTUP_DEADLINE = 90.0
PROXY_HEADERS = {"X-Forwarded-Proto": "https"}
OWNER_PASSWORD = "hostile-owner-password"  # control_plane creates the tenant's owner with it


# ------------------------------------------------------------------------------------ Redis


@dataclass
class OwnRedis:
    url: str
    process: subprocess.Popen[Any]
    folder: Path | None = None

    def kill(self) -> None:
        """SIGKILL, as a crashed or OOM-killed Redis: no shutdown, no save."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def restart(self) -> None:
        """SIGKILL, then a new server on the same port, empty (nothing was saved)."""
        self.kill()
        assert self.folder is not None
        self.process = _start_redis(int(self.url.rsplit(":", 1)[1].split("/")[0]), self.folder)


def _start_redis(port: int, folder: Path) -> subprocess.Popen[Any]:
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server is not installed")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until(
            lambda: redis_answers(url),
            f"redis-server on port {port} to start",
            deadline=STARTUP_DEADLINE,
            alive=process,
        )
    except BaseException:
        process.kill()
        process.wait(timeout=30)
        raise
    return process


@contextmanager
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    port = free_port()
    folder = tmp_path / f"redis-{port}"
    folder.mkdir()
    server = OwnRedis(f"redis://127.0.0.1:{port}/0", _start_redis(port, folder), folder)
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait(timeout=30)


# --------------------------------------------------------------------------------- Postgres


def _psycopg_url(url: str) -> str:
    return url.replace("postgres://", "postgresql://", 1)


def pg_execute(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(_psycopg_url(url), autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


@dataclass
class OwnDatabase:
    url: str  # as the runtime role (DATABASE_URL)
    name: str
    admin_url: str  # the maintenance database, from which this one is watched and dropped

    @property
    def owner_url(self) -> str:
        return as_owner(self.url)

    def connections(self) -> int:
        """Backends connected to this database now (the watcher itself is in another one)."""
        sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
        rows = pg_execute(self.admin_url, sql, (self.name,))
        return int(rows[0][0])


def as_owner(url: str) -> str:
    """`url` (a database of the runtime role's) with the owner role's credentials, from
    DATABASE_OWNER_URL: the role that creates, migrates and owns databases (core/rls.py)."""
    owner = os.environ.get("DATABASE_OWNER_URL", "")
    if not owner.startswith(("postgres://", "postgresql://")):
        pytest.fail("needs DATABASE_OWNER_URL=postgres://owner:...@.../... beside DATABASE_URL")
    parts, credentials = urlsplit(url), urlsplit(owner).netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{credentials}@{parts.netloc.rpartition('@')[2]}"))


@contextmanager
def own_database() -> Iterator[OwnDatabase]:
    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith(("postgres://", "postgresql://")):
        unavailable("needs DATABASE_URL=postgres://...")
    parts = urlsplit(base)
    name = f"{parts.path.lstrip('/') or 'sagaplane'}_hostile_{uuid.uuid4().hex[:8]}"
    admin_url = as_owner(urlunsplit(parts._replace(path="/postgres")))
    pg_execute(admin_url, f'CREATE DATABASE "{name}"')  # owned by the owner role
    try:
        yield OwnDatabase(urlunsplit(parts._replace(path="/" + name)), name, admin_url)
    finally:
        pg_execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ------------------------------------------------------------------------- the control plane


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@dataclass
class ControlPlane:
    url: str
    api_key: str
    process: subprocess.Popen[Any]
    log: Path

    def client(self, **kwargs: Any) -> httpx.Client:
        headers = {**PROXY_HEADERS, "Authorization": f"Bearer {self.api_key}"}
        return httpx.Client(base_url=self.url, headers=headers, **kwargs)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@contextmanager
def control_plane(
    env: dict[str, str], *, workers: int, tenant: str = "hostile", serve_env: dict[str, str] | None = None
) -> Iterator[ControlPlane]:
    """Migrate (as the owner role, the one step that needs DATABASE_OWNER_URL), create a tenant
    and an ingest+read key, then serve with the README's command as the runtime role (or with
    `serve_env`, to see how a misconfigured server behaves)."""
    manage({**env, "DATABASE_OWNER_URL": as_owner(env["DATABASE_URL"])}, "migrate", "--noinput")
    manage(env, "collectstatic", "--noinput")  # the build step: pages need the hashed-file manifest
    manage(
        env,
        "create_tenant",
        tenant,
        "--name",
        tenant.title(),
        "--owner-email",
        f"owner@{tenant}.example",
        "--owner-password",
        OWNER_PASSWORD,
    )
    out = manage(env, "create_api_key", "--tenant", tenant, "--name", "hostile", "--scopes", "ingest,read")
    api_key = out.strip().splitlines()[-1]
    log = Path(env["SAGAPLANE_DATA_DIR"]) / f"gunicorn-{uuid.uuid4().hex[:8]}.log"
    with gunicorn(
        serve_env or env,
        log,
        workers=workers,
        probe_headers=PROXY_HEADERS,
        graceful_timeout_s=10,
        config=ROOT / "infra" / "gunicorn.conf.py",
        deadline=STARTUP_DEADLINE,
    ) as (url, process):
        yield ControlPlane(url, api_key, process, log)


def _cookies(response: httpx.Response) -> dict[str, str]:
    # Read from Set-Cookie directly: the cookies are Secure, so a client speaking plain http to
    # the replica (behind the TLS proxy that X-Forwarded-Proto stands for) would not keep them.
    jar: SimpleCookie = SimpleCookie()
    for header in response.headers.get_list("set-cookie"):
        jar.load(header)
    return {name: morsel.value for name, morsel in jar.items()}


def sign_in(server: ControlPlane, email: str, password: str, tenant: str = "hostile") -> dict[str, str]:
    """Sign in through the sign-in page; the headers a browser would send afterwards (session and
    CSRF cookies, the CSRF header, a same-origin Referer, the tenant)."""
    page = httpx.get(f"{server.url}/login/", headers=PROXY_HEADERS, timeout=30)
    assert page.status_code == 200, page.text
    csrf = _cookies(page)["csrftoken"]
    form_token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert form_token is not None, page.text
    signed_in = httpx.post(
        f"{server.url}/login/",
        data={"username": email, "password": password, "csrfmiddlewaretoken": form_token[1]},
        headers={**PROXY_HEADERS, "Referer": "https://127.0.0.1/login/", "Cookie": f"csrftoken={csrf}"},
        timeout=30,
    )
    assert signed_in.status_code == 302, signed_in.text
    cookies = {"csrftoken": csrf, **_cookies(signed_in)}
    return {
        "Cookie": f"sessionid={cookies['sessionid']}; csrftoken={cookies['csrftoken']}",
        "X-CSRFToken": cookies["csrftoken"],
        "Referer": "https://127.0.0.1/",
        "X-Sagaplane-Tenant": tenant,
    }


# ------------------------------------------------------------------------------- the agent


@dataclass
class Chain:
    """One agent's stream: chained records, as the SDK writes them."""

    stream: str
    head: str = GENESIS
    seq: int = 0
    sagas: list[str] = field(default_factory=list)

    def saga(self, steps: int = 2) -> list[dict[str, Any]]:
        saga_id = f"{self.stream}-saga-{len(self.sagas) + 1}"
        self.sagas.append(saga_id)
        items: list[tuple[str, dict[str, Any]]] = [("SAGA_START", {"saga_id": saga_id, "name": "hostile"})]
        for n in range(steps):
            step = {
                "saga_id": saga_id,
                "step_id": f"{saga_id}-s{n}",
                "tool": "payments.charge",
                "kwargs": {"n": n},
            }
            items += [("STEP_INTENT", step), ("STEP_COMMITTED", step)]
        items.append(("SAGA_COMPLETE", {"saga_id": saga_id}))
        out = []
        for event, fields in items:
            self.seq += 1
            record = {"seq": self.seq, "ts": round(time.time(), 6), "event": event, **fields}
            self.head = stamp(record, self.head)
            out.append(record)
        return out
