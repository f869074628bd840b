"""The console's Slack pages ask Slack with no transaction open (docs/ARCHITECTURE.md §1): every
Web API call a page makes (the channel list, the install's code exchange and check, the channel
choice, uninstall, the link page's name) is seen by a wrapper around slack-sdk's one way out,
which notes whether the request's database connection was inside a transaction at that moment.

These tests run with real transactions (`transactional_db`): inside the usual per-test
transaction every call would look held."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from slack_sdk import WebClient

from core.sql import is_postgres
from slackapp import services
from slackapp.models import OAuthState, UserLink
from tests.slackapp.slack_server import FakeSlack
from tests.support.chains import server_stream
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.slack import browser, install

pytestmark = pytest.mark.django_db(transaction=True)


def _held() -> bool:
    """Whether this thread's connection is inside a transaction (Django's view, and on Postgres
    the server's: psycopg's status is IDLE only between transactions)."""
    if connection.in_atomic_block or not connection.get_autocommit():
        return True
    if is_postgres() and connection.connection is not None:
        from psycopg.pq import TransactionStatus

        return bool(connection.connection.info.transaction_status != TransactionStatus.IDLE)
    return False


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[bool]]]:
    """Per Slack method the pages called, whether a transaction was open at each call."""
    seen: dict[str, list[bool]] = {}
    real = WebClient.api_call

    def api_call(client: WebClient, api_method: str, *args: Any, **kwargs: Any) -> Any:
        seen.setdefault(api_method, []).append(_held())
        return real(client, api_method, *args, **kwargs)

    monkeypatch.setattr(WebClient, "api_call", api_call)
    yield seen


def test_installing_and_choosing_a_channel_wait_on_slack_outside_transactions(
    slack: FakeSlack, alice: Person, held: dict[str, list[bool]]
) -> None:
    client = browser(alice.user)
    answer = install(client, slack, channel=None)  # settings page (no channels yet), the callback
    assert answer.status_code == 302
    assert held == {"oauth.v2.access": [False], "auth.test": [False]}
    settings_page = client.get("/integrations/slack/")
    assert 'value="C0GENERAL"' in settings_page.content.decode()  # the list Slack gave, shown
    assert client.post("/integrations/slack/channel", {"channel": "C0GENERAL"}).status_code == 302
    assert held["conversations.list"] == [False, False]
    # What the pages stored and recorded is what they did inside one transaction before.
    events = [r["event"] for r in server_stream(alice.tenant) if r["event"].startswith("SLACK_")]
    assert events == ["SLACK_INSTALLED", "SLACK_CHANNEL_CHANGED"]
    assert "Approval requests go to #general." in client.get("/integrations/slack/").content.decode()


def test_a_refused_exchange_is_shown_and_leaves_the_state_spent(
    slack: FakeSlack, alice: Person, held: dict[str, list[bool]]
) -> None:
    client = browser(alice.user)
    client.get("/integrations/slack/")  # issues a state
    state = in_tenant(lambda tenant: OAuthState.objects.get().state, alice.tenant)
    answer = client.get(f"/integrations/slack/oauth/callback?code=not-a-code&state={state}")
    assert answer.status_code == 302
    assert "Slack refused the install" in client.get("/integrations/slack/").content.decode()
    assert held["oauth.v2.access"] == [False]
    assert not in_tenant(lambda tenant: OAuthState.objects.filter(state=state).exists(), alice.tenant)


def test_uninstalling_waits_on_slack_outside_a_transaction(
    slack: FakeSlack, alice: Person, held: dict[str, list[bool]]
) -> None:
    client = browser(alice.user)
    install(client, slack)
    assert client.post("/integrations/slack/uninstall").status_code == 302
    assert held["apps.uninstall"] == [False]
    assert slack.tokens == {}
    assert [r["event"] for r in server_stream(alice.tenant)].count("SLACK_UNINSTALLED") == 1
    assert "Slack uninstalled" in client.get("/integrations/slack/").content.decode()


def test_the_link_page_asks_the_name_outside_a_transaction(
    slack: FakeSlack, alice: Person, held: dict[str, list[bool]]
) -> None:
    install(browser(alice.user), slack)
    slack.users["U0ALICE"] = {"id": "U0ALICE", "name": "alice.l", "profile": {"display_name": "Alice L."}}
    path = services.link_url(alice.tenant, slack.team_id, "U0ALICE").removeprefix("http://testserver")
    client = browser(alice.user)
    assert '<strong id="slack-name">Alice L.</strong>' in client.get(path).content.decode()
    assert 'id="slack-linked"' in client.post(path).content.decode()
    assert held["users.info"] == [False, False]
    (link,) = in_tenant(lambda tenant: list(UserLink.objects.all()), alice.tenant)
    assert (link.slack_user_id, link.slack_name, link.user_id) == ("U0ALICE", "Alice L.", alice.user.pk)
    (record,) = [r for r in server_stream(alice.tenant) if r["event"] == "SLACK_USER_LINKED"]
    assert record["new"]["name"] == "Alice L."
