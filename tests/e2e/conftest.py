"""A real control plane for browser tests: daphne (HTTP + websockets) in a subprocess with its own
data folder, migrated and seeded with the management commands, driven by Debian's Chromium.

Database: with DATABASE_URL set (Postgres), a throw-away database next to it is created and
dropped afterwards; otherwise embedded SQLite in the data folder. REDIS_URL is passed through, so
on Redis the channel layer is the real one; on SQLite the in-memory layer works because the
ingest goes through the same server process over HTTP.

The fixtures only: what the tests share besides (the seeded people, the live server's calls,
signing in, the confirmation dialog, passkeys) is in browser.py."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.e2e.browser import CAROL, PASSWORD, ROOT, LiveServer
from tests.hostile.production import as_owner
from tests.slackapp.slack_server import FakeSlack, start
from tests.support.chromium import CHROMIUM, launched
from tests.support.ports import free_port
from tests.support.prerequisites import unavailable
from tests.support.probes import healthy
from tests.support.waiting import wait_until

VENV_BIN = Path(sys.executable).parent
STARTUP_DEADLINE = 60.0


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [str(VENV_BIN / "python"), "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _postgres_database(url: str) -> tuple[str, str, str]:
    """(admin url, e2e url, e2e database name) for a throw-away database beside DATABASE_URL's."""
    parts = urlsplit(url)
    name = f"{parts.path.lstrip('/') or 'sagaplane'}_e2e_{uuid.uuid4().hex[:8]}"
    # CREATE/DROP DATABASE run from the maintenance database, which always exists.
    return urlunsplit(parts._replace(path="/postgres")), urlunsplit(parts._replace(path="/" + name)), name


def _pg_execute(admin_url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(admin_url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture(scope="session")
def fake_slack() -> Iterator[FakeSlack]:
    """The local Slack stand-in (Web API and consent page) on an origin of its own."""
    slack, server = start(FakeSlack())
    try:
        yield slack
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory, fake_slack: FakeSlack) -> Iterator[LiveServer]:
    if not Path(CHROMIUM).exists():
        unavailable(f"{CHROMIUM} is not installed (apt-get install chromium)")
    data_dir = tmp_path_factory.mktemp("e2e-data")
    # The server and worker run as the runtime role; only migrate gets the owner's URL.
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_OWNER_URL")}
    env.update(
        {
            "SAGAPLANE_DATA_DIR": str(data_dir),
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "PYTHONUNBUFFERED": "1",
            # Slack is the local stand-in, on another origin than the server's.
            "SLACK_CLIENT_ID": fake_slack.client_id,
            "SLACK_CLIENT_SECRET": fake_slack.client_secret,
            "SLACK_SIGNING_SECRET": fake_slack.signing_secret,
            "SLACK_API_URL": fake_slack.url + "/api/",
        }
    )
    if os.environ.get("REDIS_URL"):
        # A Redis database of its own, eight above the run's: neither the run's own workers nor
        # another run's e2e server (each run has its own REDIS_URL database) may take its tasks.
        parts = urlsplit(os.environ["REDIS_URL"])
        own = int(parts.path.lstrip("/") or 0)
        env["REDIS_URL"] = urlunsplit(parts._replace(path=f"/{(own + 8) % 16}"))
    dropped_db = None
    migrate_env = env
    if os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        admin_url, e2e_url, name = _postgres_database(os.environ["DATABASE_URL"])
        admin_url = as_owner(admin_url)  # the owner role creates, owns and drops it
        _pg_execute(admin_url, f'CREATE DATABASE "{name}"')
        dropped_db = (admin_url, name)
        env["DATABASE_URL"] = e2e_url
        migrate_env = {**env, "DATABASE_OWNER_URL": as_owner(e2e_url)}
    try:
        _manage(migrate_env, "migrate", "--noinput")
        _manage(env, "seed_demo", "--password", PASSWORD)
        _manage(
            env,
            "create_tenant",
            "bravo",
            "--name",
            "Bravo Logistics",
            "--owner-email",
            CAROL,
            "--owner-password",
            PASSWORD,
        )
        key_out = _manage(
            env,
            "create_api_key",
            "--tenant",
            "demo",
            "--name",
            "e2e-agent",
            "--scopes",
            "ingest,gate,read,recovery",
        )
        api_key = key_out.strip().splitlines()[-1]

        port = free_port()
        env["SAGAPLANE_PUBLIC_URL"] = f"http://127.0.0.1:{port}"  # where Slack sends the owner back
        log = data_dir / "server.log"
        with log.open("w") as log_file:
            process = subprocess.Popen(
                [
                    str(VENV_BIN / "daphne"),
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "controlplane.asgi:application",
                ],
                cwd=ROOT,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        # The worker with its beat: integrates the log (signs checkpoints) and builds exports.
        worker_log = data_dir / "worker.log"
        with worker_log.open("w") as log_file:
            worker = subprocess.Popen(
                [
                    str(VENV_BIN / "celery"),
                    "-A",
                    "controlplane",
                    "worker",
                    "-B",
                    "--pool=solo",
                    "--loglevel=INFO",
                    "-n",
                    f"e2e-{uuid.uuid4().hex[:8]}@%h",
                ],
                cwd=ROOT,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_until(
                lambda: healthy(url),
                "the server to answer /healthz",
                deadline=STARTUP_DEADLINE,
                alive=process,
                context=lambda: log.read_text()[-3000:],
            )
            yield LiveServer(url=url, api_key=api_key, data_dir=data_dir, log=log)
        finally:
            for child in (process, worker):
                child.terminate()
            for child in (process, worker):
                try:
                    child.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait(timeout=10)
    finally:
        if dropped_db is not None:
            _pg_execute(dropped_db[0], f'DROP DATABASE IF EXISTS "{dropped_db[1]}" WITH (FORCE)')


# Module scope, not session: Playwright's sync API keeps an event loop running on this thread
# while it is open, which would break every later test that calls asyncio.run().
@pytest.fixture(scope="module")
def browser_instance() -> Iterator[object]:
    with launched() as browser:
        yield browser


@pytest.fixture
def new_page(browser_instance, control_plane: LiveServer):  # type: ignore[no-untyped-def]
    """A factory of fresh browser contexts (one per person), closed after the test."""
    contexts = []

    def make(*, width: int = 1280, height: int = 900):  # type: ignore[no-untyped-def]
        context = browser_instance.new_context(
            base_url=control_plane.url, viewport={"width": width, "height": height}
        )
        context.set_default_timeout(15_000)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()
