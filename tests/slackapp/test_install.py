"""Installing Slack per tenant: the OAuth v2 round trip against the local Slack server, the state
single-use and bound to its owner and tenant, the token encrypted, uninstall (by the owner, or
Slack's app_uninstalled / tokens_revoked events) deleting it, and a third tenant seeing none of it."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.utils import timezone

from core.scoping import tenant_context
from slackapp import crypto, selectors, services
from slackapp.models import Installation, OAuthState, UserLink
from tenants.actors import named_actor
from tests.slackapp.slack_server import FakeSlack
from tests.support.chains import server_stream
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.slack import browser, consent_url, install, signed_post


def _installation(person: Person) -> Installation | None:
    with tenant_context(person.tenant):
        return Installation.objects.first()


def test_oauth_round_trip_stores_an_encrypted_token(slack: FakeSlack, alice: Person) -> None:
    answer = install(browser(alice.user), slack)
    assert answer.status_code == 302 and answer["Location"] == "/integrations/slack/"
    row = _installation(alice)
    assert row is not None
    (token,) = slack.tokens
    assert row.team_id == slack.team_id and row.team_name == slack.team_name
    assert row.bot_user_id == slack.bot_user_id and row.installed_by == f"user:{alice.user.username}"
    assert row.channel_id == "C0RISK" and row.channel_name == "risk-approvals"
    # At rest the token is ciphertext, bound to this tenant and team; it decrypts to what Slack granted.
    assert token not in row.encrypted_bot_token and token.split("-", 1)[1] not in row.encrypted_bot_token
    assert services.bot_token(row) == token
    with pytest.raises(crypto.TokenUnreadable):
        crypto.decrypt_token(row.encrypted_bot_token, tenant_id=row.tenant_id + 1, team_id=row.team_id)
    # The exchange used the app's credentials and the code once; the token was checked with auth.test.
    (exchange,) = slack.called("oauth.v2.access")
    assert exchange.params["redirect_uri"] == "http://testserver/integrations/slack/oauth/callback"
    assert [c.token for c in slack.called("auth.test")] == [token]
    # Audited, with no token in the evidence.
    records = [r for r in server_stream(alice.tenant) if r["event"].startswith("SLACK_")]
    assert [r["event"] for r in records] == ["SLACK_INSTALLED", "SLACK_CHANNEL_CHANGED"]
    assert records[0]["old"] is None and records[0]["new"]["team_id"] == slack.team_id
    assert token not in json.dumps(records)
    # The consent page was asked for the bot scopes, with a state.
    (consent,) = slack.called("oauth/v2/authorize")
    assert set(consent.params["scope"].split(",")) == set(services.BOT_SCOPES) and consent.params["state"]


def test_a_reused_state_installs_nothing(slack: FakeSlack, alice: Person) -> None:
    client = browser(alice.user)
    first = install(client, slack, channel=None)
    assert _installation(alice) is not None
    in_tenant(services.uninstall, alice.tenant, slack.team_id, actor=named_actor("test"))
    again = client.get(first.callback_url)
    assert again.status_code == 302
    assert _installation(alice) is None
    assert len(slack.called("oauth.v2.access")) == 1  # refused before any exchange
    with tenant_context(alice.tenant):
        assert not OAuthState.objects.exists()


def test_a_forged_state_installs_nothing(slack: FakeSlack, alice: Person) -> None:
    client = browser(alice.user)
    consent_url(client)  # a real state exists, but the callback names another
    answer = client.get("/integrations/slack/oauth/callback?code=anything&state=forged-state")
    assert answer.status_code == 302
    assert "unknown, used or expired" in client.get("/integrations/slack/").content.decode()
    assert _installation(alice) is None and slack.called("oauth.v2.access") == []


def test_an_expired_state_installs_nothing(slack: FakeSlack, alice: Person) -> None:
    store = services.StateStore(alice.tenant, alice.user)
    with tenant_context(alice.tenant):
        state = store.issue()
    with tenant_context(alice.tenant):
        OAuthState.objects.filter(state=state).update(expires_at=timezone.now() - timedelta(seconds=1))
    with tenant_context(alice.tenant):
        assert store.consume(state) is False
    with tenant_context(alice.tenant):
        assert not OAuthState.objects.filter(state=state).exists()  # spent all the same


def test_a_state_is_bound_to_its_owner_and_tenant(slack: FakeSlack, alice: Person, carol: Person) -> None:
    with tenant_context(alice.tenant):
        state = services.StateStore(alice.tenant, alice.user).issue()
    with tenant_context(carol.tenant):
        assert services.StateStore(carol.tenant, carol.user).consume(state) is False  # another tenant's
    with tenant_context(alice.tenant):
        assert services.StateStore(alice.tenant, alice.user).consume(state) is True
    with tenant_context(alice.tenant):
        assert services.StateStore(alice.tenant, alice.user).consume(state) is False  # once


def test_only_owners_install(slack: FakeSlack, alice: Person, bob: Person) -> None:
    assert browser(bob.user).get("/integrations/slack/").status_code == 403
    with tenant_context(alice.tenant):
        assert not OAuthState.objects.exists()


def test_add_to_slack_is_a_link_to_the_consent_page_with_a_state_of_this_owner(
    slack: FakeSlack, alice: Person, carol: Person
) -> None:
    """A link, not a form: a form posted here and redirected to Slack's origin is blocked by the
    pages' CSP (`form-action 'self'`) in a real browser (tests/e2e/test_slack.py clicks it)."""
    client = browser(alice.user)
    page = client.get("/integrations/slack/")
    assert "form-action 'self'" in page["Content-Security-Policy"]
    assert 'action="/integrations/slack/install"' not in page.content.decode()
    url = urlsplit(consent_url(client))
    assert f"{url.scheme}://{url.netloc}" == slack.url and url.path == "/oauth/v2/authorize"
    state = parse_qs(url.query)["state"][0]
    with tenant_context(carol.tenant):
        assert services.StateStore(carol.tenant, carol.user).consume(state) is False
    with tenant_context(alice.tenant):
        assert services.StateStore(alice.tenant, alice.user).consume(state) is True
    # Once installed, the page offers no install link (and issues no state).
    install(client, slack)
    with tenant_context(alice.tenant):
        before = OAuthState.objects.count()
    assert 'id="slack-add"' not in client.get("/integrations/slack/").content.decode()
    with tenant_context(alice.tenant):
        assert OAuthState.objects.count() == before


def test_the_owner_chooses_the_channel_among_the_workspaces(slack: FakeSlack, alice: Person) -> None:
    client = browser(alice.user)
    install(client, slack, channel=None)
    assert _installation(alice).channel_id == ""  # type: ignore[union-attr]
    client.post("/integrations/slack/channel", {"channel": "C0NOTTHERE"})
    assert _installation(alice).channel_id == ""  # type: ignore[union-attr]
    client.post("/integrations/slack/channel", {"channel": "C0GENERAL"})
    assert _installation(alice).channel_name == "general"  # type: ignore[union-attr]


def test_uninstall_by_the_owner_revokes_and_deletes(slack: FakeSlack, alice: Person) -> None:
    client = browser(alice.user)
    install(client, slack)
    in_tenant(
        services.link_user,
        alice.tenant,
        alice.user,
        team_id=slack.team_id,
        slack_user_id="U0ALICE",
        how="confirmed",
        actor=named_actor("test"),
    )
    assert client.post("/integrations/slack/uninstall").status_code == 302
    assert _installation(alice) is None and slack.tokens == {}
    assert len(slack.called("apps.uninstall")) == 1
    with tenant_context(alice.tenant):
        assert not UserLink.objects.exists()
    last = [r for r in server_stream(alice.tenant) if r["event"] == "SLACK_UNINSTALLED"]
    assert len(last) == 1 and last[0]["new"] is None and last[0]["old"]["linked_users"] == 1


def _event(slack: FakeSlack, event: dict[str, Any]) -> bytes:
    return json.dumps(
        {"type": "event_callback", "team_id": slack.team_id, "api_app_id": slack.app_id, "event": event}
    ).encode()


@pytest.mark.parametrize(
    "event",
    [{"type": "app_uninstalled"}, {"type": "tokens_revoked", "tokens": {"oauth": [], "bot": ["U0BOT"]}}],
    ids=["app_uninstalled", "tokens_revoked"],
)
def test_slack_events_delete_the_installation(slack: FakeSlack, alice: Person, event: dict[str, Any]) -> None:
    install(browser(alice.user), slack)
    answer = signed_post(
        browser(alice.user), slack, "/slack/events", _event(slack, event), content_type="application/json"
    )
    assert answer.status_code == 200
    assert _installation(alice) is None
    (record,) = [r for r in server_stream(alice.tenant) if r["event"] == "SLACK_UNINSTALLED"]
    assert record["actor"].startswith("system:slack-")


def test_revoking_only_user_tokens_keeps_the_installation(slack: FakeSlack, alice: Person) -> None:
    install(browser(alice.user), slack)
    body = _event(slack, {"type": "tokens_revoked", "tokens": {"oauth": ["U0OWNER"], "bot": []}})
    assert (
        signed_post(
            browser(alice.user), slack, "/slack/events", body, content_type="application/json"
        ).status_code
        == 200
    )
    assert _installation(alice) is not None


def test_an_unsigned_uninstall_event_deletes_nothing(slack: FakeSlack, alice: Person) -> None:
    install(browser(alice.user), slack)
    body = _event(slack, {"type": "app_uninstalled"})
    forged = slack.sign(body, secret="not-the-signing-secret")
    answer = signed_post(
        browser(alice.user), slack, "/slack/events", body, content_type="application/json", headers=forged
    )
    assert answer.status_code == 401 and answer.json()["error"] == "bad_signature"
    assert _installation(alice) is not None


def test_url_verification_answers_the_challenge(slack: FakeSlack, alice: Person) -> None:
    body = json.dumps(
        {
            "type": "url_verification",
            "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
            "token": "x",
        }
    ).encode()
    answer = signed_post(browser(alice.user), slack, "/slack/events", body, content_type="application/json")
    assert answer.status_code == 200
    assert answer.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}


def test_a_third_tenant_sees_nothing(slack: FakeSlack, alice: Person, carol: Person) -> None:
    """carol owns tenant b: acme's workspace, token, links and state are invisible to her, and she
    cannot connect the same workspace to her tenant."""
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
    with tenant_context(alice.tenant):
        services.StateStore(alice.tenant, alice.user).issue()
    assert selectors.tenant_of_team(slack.team_id) == alice.tenant
    with tenant_context(carol.tenant):
        assert selectors.installation() is None
        assert not UserLink.objects.exists() and not OAuthState.objects.exists()
        if connection.vendor == "postgresql":  # row-level security: even raw SQL sees none of acme's rows
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT count(*) FROM {Installation._meta.db_table}")
                assert cursor.fetchone()[0] == 0
                cursor.execute(f"SELECT count(*) FROM {UserLink._meta.db_table}")
                assert cursor.fetchone()[0] == 0
    own = browser(alice.user).get("/integrations/slack/").content.decode()
    assert slack.team_name in own and "U0ALICE" in own and alice.user.email in own
    page = browser(carol.user).get("/integrations/slack/").content.decode()
    assert slack.team_name not in page and "U0ALICE" not in page and "Add to Slack" in page
    # The same workspace cannot be connected to a second tenant: its requests would name two.
    client = browser(carol.user)
    answer = install(client, slack, channel=None)
    assert answer.status_code == 302
    assert _installation(carol) is None
    assert "connected to another Sagaplane tenant" in client.get("/integrations/slack/").content.decode()
    assert selectors.tenant_of_team(slack.team_id) == alice.tenant
