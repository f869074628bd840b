"""Slack tests: a local server speaking Slack's Web API (slack_server.py), the app's settings
pointed at it, Celery tasks run in-process (eagerly) so a test sees the work the views queue; and,
for the channel tests, the approvals tests' agent (alice's key: she is the requester) and
approvers. The helpers that play Slack's side (signed requests) and the owner's browser (the
install) are in tests/support/slack.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controlplane.celery import app as celery_app
from tenants.models import Role, Tenant
from tests.slackapp.slack_server import FakeSlack, start
from tests.support.approvals import Agent, payments_agent
from tests.support.factories import Person, make_person


@pytest.fixture(autouse=True)
def _database_store(database_store: None) -> None:
    """Every Slack test runs on the database store (tests/conftest.database_store), as the approvals
    tests do."""
    return database_store


@pytest.fixture
def agent(alice: Person) -> Agent:
    """The payments agent's key, created by alice: she is the requester of what it asks."""
    return payments_agent(alice)


@pytest.fixture
def ann(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "ann", Role.APPROVER)


@pytest.fixture
def ben(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "ben", Role.APPROVER)


@pytest.fixture
def adam(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "adam", Role.ADMIN)


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
