"""Slack tests: a local server speaking Slack's Web API (slack_server.py), the app's settings
pointed at it, Celery tasks run in-process (eagerly) so a test sees the work the views queue, on
the database store as the approvals tests (the agent and approvers are the suite's people,
tests/conftest.py). The helpers that play Slack's side (signed requests) and the owner's browser (the
install) are in tests/support/slack.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controlplane.celery import app as celery_app
from tests.slackapp.slack_server import FakeSlack, start


@pytest.fixture(autouse=True)
def _database_store(database_store: None) -> None:
    """Every Slack test runs on the database store (tests/conftest.database_store), as the approvals
    tests do."""
    return database_store


@pytest.fixture
def slack(settings: Any) -> Iterator[FakeSlack]:
    fake, server = start(FakeSlack())
    settings.SLACK_CLIENT_ID = fake.client_id
    settings.SLACK_CLIENT_SECRET = fake.client_secret
    settings.SLACK_SIGNING_SECRET = fake.signing_secret
    settings.SLACK_API_URL = fake.url + "/api/"
    settings.SAGAPLANE_PUBLIC_URL = "http://testserver"
    eager, propagates = celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates
    celery_app.conf.task_always_eager = True
    celery_app.conf.task_eager_propagates = True
    try:
        yield fake
    finally:
        celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = eager, propagates
        server.shutdown()
        server.server_close()
