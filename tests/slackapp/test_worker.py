"""Slack is answered at once and the work is done by a Celery worker, another process.

A live control plane (this process, Celery not eager) and a real worker (`celery -A controlplane
worker`, a subprocess on the same database and broker). Slack's response URL is held shut by the
test: if the view did the work itself, its answer would wait behind it. It does not: the answer
comes while the work waits, and once the test opens the response URL the worker finishes —
the halt is in force and the member is told so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connection

from controlplane.celery import app as celery_app
from core.scoping import tenant_context
from fleet.models import Halt
from slackapp import services
from tenants.actors import named_actor
from tests.slackapp.slack_server import FakeSlack
from tests.support.factories import Person
from tests.support.processes import stop_group
from tests.support.scoping import in_tenant
from tests.support.slack import browser, command_body, install
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0
ANSWER_BOUND = 20.0

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def _database_url() -> str:
    db = connection.settings_dict
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{host}:{port}/{db['NAME']}"


def test_the_view_answers_at_once_and_a_worker_does_the_work(
    transactional_db: None, live_server: Any, slack: FakeSlack, alice: Person, tmp_path: Path
) -> None:
    install(browser(alice.user), slack)
    in_tenant(
        services.link_user,
        alice.tenant,
        alice.user,
        team_id=slack.team_id,
        slack_user_id="U0ALICE",
        how="confirmed",
        actor=named_actor("test"),
    )
    celery_app.conf.task_always_eager = False  # the slack fixture restores it
    celery_app.control.purge()  # what earlier tests left on this broker is not this test's work
    log = tmp_path / "worker.log"
    env = {
        **{k: v for k, v in os.environ.items() if k != "DATABASE_OWNER_URL"},
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": _database_url(),
        "SECRET_KEY": settings.SECRET_KEY,
        "SAGAPLANE_MASTER_KEY": ",".join(settings.SAGAPLANE_MASTER_KEYS),
        "SAGAPLANE_PUBLIC_URL": settings.SAGAPLANE_PUBLIC_URL,
        "SLACK_CLIENT_ID": slack.client_id,
        "SLACK_CLIENT_SECRET": slack.client_secret,
        "SLACK_SIGNING_SECRET": slack.signing_secret,
        "SLACK_API_URL": settings.SLACK_API_URL,
        "SAGAPLANE_GATE_STORE": "database",
    }
    name = f"slack-{uuid.uuid4().hex[:8]}@%h"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo", "-n", name,
             "--without-mingle", "--without-gossip", "-l", "INFO"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_until(
            lambda: "ready" in log.read_text(),
            "the worker to start",
            alive=worker,
            context=lambda: log.read_text()[-3000:],
        )
        slack.hooks_open.clear()  # Slack's response URL holds every answer until the test opens it
        body = command_body(slack, "/saga-halt", "tool:stripe.* fraud", user="U0ALICE")
        headers = {k.removeprefix("HTTP_").replace("_", "-"): v for k, v in slack.sign(body).items()}
        answer = httpx.post(
            f"{live_server.url}/slack/commands",
            content=body,
            headers={**headers, "Content-Type": "application/x-www-form-urlencoded"},
            timeout=ANSWER_BOUND,  # far above Slack's 3 s, far below the 60 s the reply is held
        )
        assert answer.status_code == 200 and "Working on" in answer.json()["text"]
        # The worker did the work and is now waiting on Slack; the view had answered already.
        (reply,) = wait_until(
            lambda: slack.called("response_url"),
            "the worker's reply",
            alive=worker,
            context=lambda: log.read_text()[-3000:],
        )
        assert "Halted `tool:stripe.*` fleet-wide" in reply.params["text"]
        with tenant_context(alice.tenant):
            (halt,) = Halt.objects.all()
        assert (halt.scope, halt.actor) == ("tool:stripe.*", f"user:{alice.user.username}")
        slack.hooks_open.set()
        wait_until(
            lambda: "succeeded" in log.read_text() and "slackapp.handle_command" in log.read_text(),
            "the task to finish",
            alive=worker,
            context=lambda: log.read_text()[-3000:],
        )
    finally:
        slack.hooks_open.set()
        stop_group(worker, first=signal.SIGTERM)
