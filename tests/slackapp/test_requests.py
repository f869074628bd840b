"""Slack's requests to /slack/...: only a signature over the exact body, within five minutes and
seen once, lets anything happen; then a Slack user acts only as the member they are linked to.

The halt command is the probe here (an effect anyone can see): a forged, stale, replayed or
altered `/saga-halt` halts nothing."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client

from core.scoping import tenant_context
from fleet.models import Halt
from slackapp import services
from slackapp.actions import signatures
from slackapp.models import SeenSignature, UserLink
from tenants.actors import named_actor
from tenants.models import Role
from tests.slackapp.slack_server import FakeSlack
from tests.support.chains import server_stream
from tests.support.factories import Person, make_person
from tests.support.scoping import in_tenant
from tests.support.slack import browser, click_body, command_body, install, signed_post

HALT = ("/saga-halt", "tool:stripe.* fraud")


@pytest.fixture
def installed(slack: FakeSlack, alice: Person) -> FakeSlack:
    install(browser(alice.user), slack)
    return slack


def _halts(person: Person) -> list[Halt]:
    with tenant_context(person.tenant):
        return list(Halt.objects.all())


def _link(person: Person, slack: FakeSlack, slack_user: str) -> None:
    in_tenant(
        services.link_user,
        person.tenant,
        person.user,
        team_id=slack.team_id,
        slack_user_id=slack_user,
        how="confirmed",
        actor=named_actor("test"),
    )


def _replies(slack: FakeSlack) -> list[str]:
    return [str(c.params.get("text", "")) for c in slack.called("response_url")]


# ----------------------------------------------------------------------------- the signature


def test_a_linked_owner_halts_a_tool_fleet_wide(installed: FakeSlack, alice: Person) -> None:
    _link(alice, installed, "U0ALICE")
    answer = signed_post(
        Client(), installed, "/slack/commands", command_body(installed, *HALT, user="U0ALICE")
    )
    assert answer.status_code == 200 and answer.json()["response_type"] == "ephemeral"
    (halt,) = _halts(alice)
    assert (halt.scope, halt.reason, halt.actor) == ("tool:stripe.*", "fraud", f"user:{alice.user.username}")
    assert "Halted `tool:stripe.*` fleet-wide" in _replies(installed)[0]
    (record,) = [r for r in server_stream(alice.tenant) if r["event"] == "KILLSWITCH_ENGAGED"]
    assert record["actor"] == f"user:{alice.user.username}" and record["new"]["scope"] == "tool:stripe.*"


def test_a_forged_signature_is_refused(installed: FakeSlack, alice: Person) -> None:
    _link(alice, installed, "U0ALICE")
    body = command_body(installed, *HALT, user="U0ALICE")
    forged = installed.sign(body, secret="guessed-secret")
    answer = signed_post(Client(), installed, "/slack/commands", body, headers=forged)
    assert answer.status_code == 401 and answer.json()["error"] == "bad_signature"
    assert _halts(alice) == [] and installed.called("response_url") == []


def test_an_unsigned_request_is_refused(installed: FakeSlack, alice: Person) -> None:
    _link(alice, installed, "U0ALICE")
    answer = signed_post(
        Client(), installed, "/slack/commands", command_body(installed, *HALT, user="U0ALICE"), headers={}
    )
    assert answer.status_code == 401 and answer.json()["error"] == "unsigned"
    assert _halts(alice) == []


@pytest.mark.parametrize("age", [301, 3600, -301], ids=["5min1s-old", "an-hour-old", "5min1s-ahead"])
def test_a_stale_timestamp_is_refused(
    installed: FakeSlack, alice: Person, age: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Correctly signed, but outside the five-minute window (either way). The check's clock is
    held at the signing moment: a second of a busy machine between signing and checking must not
    carry a request signed 301 s ahead back inside the window."""
    _link(alice, installed, "U0ALICE")
    body = command_body(installed, *HALT, user="U0ALICE")
    now = int(time.time())
    monkeypatch.setattr(signatures, "time", SimpleNamespace(time=lambda: float(now)))
    answer = signed_post(Client(), installed, "/slack/commands", body, timestamp=now - age)
    assert answer.status_code == 401 and answer.json()["error"] == "stale_request"
    assert _halts(alice) == []


def test_a_replayed_request_is_refused(installed: FakeSlack, alice: Person) -> None:
    _link(alice, installed, "U0ALICE")
    body = command_body(installed, "/saga-halt", "tool:crm.* first", user="U0ALICE")
    headers = installed.sign(body)
    assert signed_post(Client(), installed, "/slack/commands", body, headers=headers).status_code == 200
    again = signed_post(Client(), installed, "/slack/commands", body, headers=headers)
    assert again.status_code == 401 and again.json()["error"] == "replayed"
    assert len(_halts(alice)) == 1  # the replay halted nothing more
    assert SeenSignature.objects.filter(signature=headers["HTTP_X_SLACK_SIGNATURE"]).count() == 1


def test_a_body_altered_after_signing_is_refused(installed: FakeSlack, alice: Person) -> None:
    _link(alice, installed, "U0ALICE")
    signed_for = command_body(installed, "/saga-status", "", user="U0ALICE")
    altered = command_body(installed, *HALT, user="U0ALICE")
    answer = signed_post(Client(), installed, "/slack/commands", altered, headers=installed.sign(signed_for))
    assert answer.status_code == 401 and answer.json()["error"] == "bad_signature"
    assert _halts(alice) == []


def test_a_click_signed_with_another_secret_decides_nothing(installed: FakeSlack, alice: Person) -> None:
    body = click_body(installed, "approve", "req-1", user="U0ALICE")
    answer = signed_post(
        Client(), installed, "/slack/interactions", body, headers=installed.sign(body, secret="x")
    )
    assert answer.status_code == 401
    assert installed.called("chat.postEphemeral") == []


def test_only_post_is_answered(installed: FakeSlack) -> None:
    answer = Client().get("/slack/commands")
    assert (
        answer.status_code == 405
        and answer.json()["error"] == "method_not_allowed"
        and answer["Allow"] == "POST"
    )


@pytest.mark.parametrize(
    "body",
    [b"payload=%7Bnot-json", b"payload=%5B1%2C2%5D", b"\xff\xfe", b"payload=" + b"%5B" * 20000],
    ids=["malformed-json", "not-an-object", "not-utf8", "deeply-nested"],
)
def test_hostile_signed_bodies_are_4xx(installed: FakeSlack, body: bytes) -> None:
    answer = signed_post(Client(), installed, "/slack/interactions", body)
    assert 400 <= answer.status_code < 500


# ------------------------------------------------------------------------------- who is asking


def test_an_unlinked_user_is_told_how_to_link_and_halts_nothing(installed: FakeSlack, alice: Person) -> None:
    signed_post(Client(), installed, "/slack/commands", command_body(installed, *HALT, user="U0STRANGER"))
    assert _halts(alice) == []
    (reply,) = _replies(installed)
    assert "not linked" in reply and "http://testserver/integrations/slack/link/" in reply


def test_an_unlinked_click_gets_an_ephemeral_link(installed: FakeSlack, alice: Person) -> None:
    body = click_body(installed, "approve", "req-1", user="U0STRANGER")
    assert signed_post(Client(), installed, "/slack/interactions", body).status_code == 200
    (ephemeral,) = installed.called("chat.postEphemeral")
    assert ephemeral.params["user"] == "U0STRANGER" and ephemeral.params["channel"] == "C0RISK"
    assert (
        "decides nothing" in ephemeral.params["text"]
        and "/integrations/slack/link/" in ephemeral.params["text"]
    )


def test_the_link_flow_needs_the_member_to_sign_in_and_confirm(installed: FakeSlack, alice: Person) -> None:
    signed_post(
        Client(), installed, "/slack/commands", command_body(installed, "/saga-status", "", user="U0ALICE")
    )
    (reply,) = _replies(installed)
    path = reply[reply.index("/integrations/slack/link/") : reply.index("|")]
    assert Client().get(path).status_code == 302  # not signed in: to the sign-in page
    client = browser(alice.user)
    page = client.get(path)
    assert page.status_code == 200 and "U0ALICE" in page.content.decode()
    with tenant_context(alice.tenant):
        assert not UserLink.objects.exists()  # opening the link links nothing
    assert client.post(path).status_code == 200
    with tenant_context(alice.tenant):
        (link,) = UserLink.objects.all()
    assert (link.slack_user_id, link.user_id, link.how) == ("U0ALICE", alice.user.pk, "confirmed")
    assert link.slack_name == ""  # Slack knew no such user: the link is shown by its id
    (record,) = [r for r in server_stream(alice.tenant) if r["event"] == "SLACK_USER_LINKED"]
    assert record["new"] == {
        "team_id": installed.team_id,
        "slack_user_id": "U0ALICE",
        "name": "",
        "how": "confirmed",
    }
    # Now the same person's command acts as alice.
    signed_post(Client(), installed, "/slack/commands", command_body(installed, *HALT, user="U0ALICE"))
    assert len(_halts(alice)) == 1


def test_a_link_keeps_the_name_slack_shows(installed: FakeSlack, alice: Person) -> None:
    """The Slack user's name (users.info, asked with the tenant's bot token) is shown on the link
    page, kept on the link and in its audit record, and listed on the Slack page beside the id."""
    installed.users["U0ALICE"] = {
        "id": "U0ALICE",
        "name": "alice.l",
        "real_name": "Alice L.",
        "profile": {"display_name": "Alice Liddell <script>"},
    }
    path = services.link_url(alice.tenant, installed.team_id, "U0ALICE").removeprefix("http://testserver")
    client = browser(alice.user)
    shown = client.get(path).content.decode()
    assert '<strong id="slack-name">Alice Liddell &lt;script&gt;</strong>' in shown
    assert client.post(path).status_code == 200
    with tenant_context(alice.tenant):
        (link,) = UserLink.objects.all()
    assert link.slack_name == "Alice Liddell <script>"
    (record,) = [r for r in server_stream(alice.tenant) if r["event"] == "SLACK_USER_LINKED"]
    assert record["new"]["name"] == "Alice Liddell <script>"
    listed = client.get("/integrations/slack/").content.decode()
    assert '<strong class="slack-name">Alice Liddell &lt;script&gt;</strong> <code>U0ALICE</code>' in listed


def test_a_link_for_one_tenant_cannot_be_confirmed_in_another(
    installed: FakeSlack, alice: Person, carol: Person
) -> None:
    path = services.link_url(alice.tenant, installed.team_id, "U0ALICE").removeprefix("http://testserver")
    answer = browser(carol.user).post(path)
    assert answer.status_code == 404
    with tenant_context(alice.tenant):
        assert not UserLink.objects.exists()
    with tenant_context(carol.tenant):
        assert not UserLink.objects.exists()


def test_a_forged_link_links_nothing(installed: FakeSlack, alice: Person) -> None:
    token = services.link_token(alice.tenant, installed.team_id, "U0ALICE")
    answer = browser(alice.user).post(f"/integrations/slack/link/{token[:-2]}xx")
    assert answer.status_code == 404
    with tenant_context(alice.tenant):
        assert not UserLink.objects.exists()


def test_a_linked_viewer_may_not_halt(installed: FakeSlack, bob: Person) -> None:
    _link(bob, installed, "U0BOB")
    signed_post(Client(), installed, "/slack/commands", command_body(installed, *HALT, user="U0BOB"))
    assert _halts(bob) == []
    assert "may not halt" in _replies(installed)[0]


def test_e_mail_matching_only_where_the_owner_turned_it_on(installed: FakeSlack, alice: Person) -> None:
    approver = make_person(alice.tenant, "dora", Role.APPROVER)
    installed.users["U0DORA"] = {"id": "U0DORA", "name": "dora", "profile": {"email": approver.user.email}}
    signed_post(Client(), installed, "/slack/commands", command_body(installed, *HALT, user="U0DORA"))
    assert _halts(alice) == [] and installed.called("users.info") == []  # off: not even asked
    browser(alice.user).post("/integrations/slack/email-matching", {"enabled": "on"})
    signed_post(Client(), installed, "/slack/commands", command_body(installed, *HALT, user="U0DORA"))
    (halt,) = _halts(alice)
    assert halt.actor == f"user:{approver.user.username}"
    with tenant_context(alice.tenant):
        (link,) = UserLink.objects.filter(slack_user_id="U0DORA")
    assert link.how == "email" and link.user_id == approver.user.pk


def test_status_lists_halts(installed: FakeSlack, alice: Person) -> None:
    _link(alice, installed, "U0ALICE")
    signed_post(Client(), installed, "/slack/commands", command_body(installed, *HALT, user="U0ALICE"))
    signed_post(
        Client(), installed, "/slack/commands", command_body(installed, "/saga-status", "", user="U0ALICE")
    )
    assert "tool:stripe.*" in _replies(installed)[1]


def test_a_workspace_no_tenant_has_is_told_so(slack: FakeSlack, alice: Person) -> None:
    answer: Any = signed_post(Client(), slack, "/slack/commands", command_body(slack, *HALT, user="U0ALICE"))
    assert answer.status_code == 200 and "not connected" in answer.json()["text"]
    assert _halts(alice) == []


@pytest.mark.parametrize("flag", ["is_bot", "is_restricted"])
def test_e_mail_matching_never_matches_bots_or_guests(installed: FakeSlack, alice: Person, flag: str) -> None:
    approver = make_person(alice.tenant, "dora", Role.APPROVER)
    profile = {"email": approver.user.email}
    installed.users["U0DORA"] = {"id": "U0DORA", "name": "dora", flag: True, "profile": profile}
    browser(alice.user).post("/integrations/slack/email-matching", {"enabled": "on"})
    signed_post(Client(), installed, "/slack/commands", command_body(installed, *HALT, user="U0DORA"))
    assert _halts(alice) == [] and len(installed.called("users.info")) == 1
    with tenant_context(alice.tenant):
        assert not UserLink.objects.filter(slack_user_id="U0DORA").exists()


def test_a_member_unlinks_their_slack_account(installed: FakeSlack, bob: Person) -> None:
    _link(bob, installed, "U0BOB")
    assert browser(bob.user).post("/integrations/slack/unlink").status_code == 302
    with tenant_context(bob.tenant):
        assert not UserLink.objects.exists()
    (record,) = [r for r in server_stream(bob.tenant) if r["event"] == "SLACK_USER_UNLINKED"]
    assert record["old"]["slack_user_id"] == "U0BOB" and record["new"] is None
    signed_post(
        Client(), installed, "/slack/commands", command_body(installed, "/saga-status", "", user="U0BOB")
    )
    assert "not linked" in _replies(installed)[0]
