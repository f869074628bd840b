"""Approval requests in the Slack channel: posted with their facts and buttons when the gate opens
them, decided by a signed click (or a command) of a linked, eligible member through the same
approvals rules as the dashboard, and updated to show who decided with the buttons gone.

The agent asking is alice's key (she is the requester and may not approve); ann and ben are
approvers, adam an admin. Work the views and hooks queue runs in-process (Celery eager), after
the commit (`django_capture_on_commit_callbacks`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from approvals import services as approvals
from approvals.models import ApprovalRequest, Status, Vote
from core.scoping import tenant_context
from slackapp import services
from tenants.actors import named_actor
from tests.slackapp.slack_server import FakeSlack, Message
from tests.support.approvals import Agent, wire_policy
from tests.support.chains import server_stream
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.slack import browser, click_body, command_body, install, signed_post

Commit = Callable[..., AbstractContextManager[Any]]


@pytest.fixture
def committed(django_capture_on_commit_callbacks: Commit) -> Callable[[], AbstractContextManager[Any]]:
    """Run what commits would run (the approvals hooks, then the queued Slack work) at the end of
    the block, as in production after each commit."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


@pytest.fixture
def channel(slack: FakeSlack, alice: Person, ann: Person, ben: Person) -> Iterator[FakeSlack]:
    install(browser(alice.user), slack)
    for person, slack_user in ((alice, "U0ALICE"), (ann, "U0ANN"), (ben, "U0BEN")):
        in_tenant(
            services.link_user,
            person.tenant,
            person.user,
            team_id=slack.team_id,
            slack_user_id=slack_user,
            how="confirmed",
            actor=named_actor("t"),
        )
    yield slack


def _open(agent: Agent, committed: Any, **policy: Any) -> str:
    wire_policy(agent.tenant, **policy)
    with committed():
        pending = agent.ask(amount=100, currency="EUR", to="DE89370400440532013000")
    assert pending["decision"] == "pending_approval"
    return str(pending["approval_id"])


def _message(slack: FakeSlack) -> Message:
    (message,) = slack.channel_messages("C0RISK")
    return message


def _actions(message: Message) -> list[dict[str, Any]]:
    return [e for b in message.blocks if b["type"] == "actions" for e in b["elements"]]


def _click(slack: FakeSlack, committed: Any, action: str, request_id: str, user: str, **kwargs: Any) -> Any:
    body = click_body(slack, action, request_id, user=user)
    with committed():
        return signed_post(Client(), slack, "/slack/interactions", body, **kwargs)


def _status(agent: Agent, request_id: str) -> tuple[str, int]:
    with tenant_context(agent.tenant):
        row = ApprovalRequest.objects.get(pk=request_id)
        return row.status, Vote.objects.filter(request=row).count()


def _ephemerals(slack: FakeSlack, user: str) -> list[str]:
    return [str(c.params["text"]) for c in slack.called("chat.postEphemeral") if c.params["user"] == user]


def test_a_pending_request_is_posted_with_its_facts_and_buttons(
    channel: FakeSlack, agent: Agent, committed: Any
) -> None:
    request_id = _open(agent, committed)
    message = _message(channel)
    text = json.dumps(message.blocks)
    for fact in (
        "bank.wire",
        "100 EUR",
        "s1",
        "large wires",
        "0 of 1 needed",
        "DE89370400440532013000",
        "<!date^",
    ):
        assert fact in text, fact
    assert [(a["action_id"], a["value"]) for a in _actions(message)] == [
        ("approve", request_id),
        ("deny", request_id),
    ]
    assert f"http://testserver/approvals/{request_id}/" in text
    (post,) = channel.called("chat.postMessage")
    assert post.token in channel.tokens  # the decrypted bot token


def test_a_linked_approver_click_decides_and_updates_the_message(
    channel: FakeSlack, agent: Agent, ann: Person, committed: Any
) -> None:
    request_id = _open(agent, committed)
    answer = _click(channel, committed, "approve", request_id, "U0ANN")
    assert answer.status_code == 200
    assert _status(agent, request_id) == (Status.APPROVED, 1)
    message = _message(channel)
    assert message.updates >= 1 and _actions(message) == []  # the buttons are gone
    text = json.dumps(message.blocks)
    assert "Approved" in text and "<@U0ANN>" in text and ann.user.username in text
    assert "the request is approved" in _ephemerals(channel, "U0ANN")[0]
    (vote,) = [r for r in server_stream(agent.tenant) if r["event"] == "APPROVAL_VOTE"]
    assert vote["voter"] == f"user:{ann.user.username}" and vote["saga_id"] == "s1"
    assert agent.ask(amount=100, currency="EUR", to="DE89370400440532013000")["decision"] == "allow"


def test_a_double_click_decides_once(channel: FakeSlack, agent: Agent, committed: Any) -> None:
    request_id = _open(agent, committed, required_approvals=2)
    _click(channel, committed, "approve", request_id, "U0ANN")
    _click(channel, committed, "approve", request_id, "U0ANN")  # a second signed click, its own body
    assert _status(agent, request_id) == (Status.PENDING, 1)
    assert "has voted on this request" in _ephemerals(channel, "U0ANN")[1]
    assert "1 of 2 needed" in json.dumps(_message(channel).blocks)
    _click(channel, committed, "approve", request_id, "U0BEN")
    _click(channel, committed, "approve", request_id, "U0BEN")
    assert _status(agent, request_id) == (Status.APPROVED, 2)
    granted = [r for r in server_stream(agent.tenant) if r["event"] == "APPROVAL_GRANTED"]
    assert len(granted) == 1


def test_an_unlinked_user_decides_nothing(channel: FakeSlack, agent: Agent, committed: Any) -> None:
    request_id = _open(agent, committed)
    assert _click(channel, committed, "approve", request_id, "U0STRANGER").status_code == 200
    assert _status(agent, request_id) == (Status.PENDING, 0)
    (told,) = _ephemerals(channel, "U0STRANGER")
    assert "decides nothing" in told and "/integrations/slack/link/" in told
    assert _actions(_message(channel)) != []


def test_the_requester_cannot_approve_from_slack(channel: FakeSlack, agent: Agent, committed: Any) -> None:
    request_id = _open(agent, committed)
    _click(channel, committed, "approve", request_id, "U0ALICE")
    assert _status(agent, request_id) == (Status.PENDING, 0)
    assert "Nothing decided" in _ephemerals(channel, "U0ALICE")[0]


def test_a_passkey_only_policy_has_no_approve_button_and_refuses_a_crafted_click(
    channel: FakeSlack, agent: Agent, committed: Any
) -> None:
    request_id = _open(agent, committed, passkey_only=True)
    (button,) = _actions(_message(channel))
    assert button["action_id"] == "open_passkey" and button["text"]["text"] == "Approve with passkey"
    assert button["url"] == f"http://testserver/approvals/{request_id}/"
    _click(channel, committed, "approve", request_id, "U0ANN")  # crafted by hand: no such button
    assert _status(agent, request_id) == (Status.PENDING, 0)
    assert "passkey" in _ephemerals(channel, "U0ANN")[0]
    with committed():
        signed_post(
            Client(), channel, "/slack/commands", command_body(channel, "/saga-approve", request_id, "U0ANN")
        )
    assert _status(agent, request_id) == (Status.PENDING, 0)


@pytest.mark.parametrize("attack", ["forged", "stale", "replayed", "altered"])
def test_unsigned_stale_replayed_or_altered_clicks_decide_nothing(
    channel: FakeSlack, agent: Agent, committed: Any, attack: str
) -> None:
    request_id = _open(agent, committed, required_approvals=2)
    body = click_body(channel, "approve", request_id, user="U0ANN")
    if attack == "forged":
        headers = channel.sign(body, secret="not-it")
    elif attack == "stale":
        headers = channel.sign(body, timestamp=int(time.time()) - 301)
    elif attack == "altered":
        headers = channel.sign(click_body(channel, "deny", request_id, user="U0ANN"))
    else:
        headers = channel.sign(body)
        with committed():
            assert (
                signed_post(Client(), channel, "/slack/interactions", body, headers=headers).status_code
                == 200
            )
        assert _status(agent, request_id) == (Status.PENDING, 1)
    with committed():
        answer = signed_post(Client(), channel, "/slack/interactions", body, headers=headers)
    assert answer.status_code == 401
    assert _status(agent, request_id) == (Status.PENDING, 1 if attack == "replayed" else 0)


def test_commands_approve_and_deny_with_a_note(
    channel: FakeSlack, agent: Agent, ben: Person, committed: Any
) -> None:
    request_id = _open(agent, committed)
    with committed():
        signed_post(
            Client(),
            channel,
            "/slack/commands",
            command_body(channel, "/saga-deny", f"{request_id} wrong IBAN", "U0BEN"),
        )
    assert _status(agent, request_id) == (Status.DENIED, 1)
    text = json.dumps(_message(channel).blocks)
    assert (
        "Denied" in text and "<@U0BEN>" in text and "wrong IBAN" in text and _actions(_message(channel)) == []
    )
    reply = [c for c in channel.called("response_url")][-1]
    assert "denied" in reply.params["text"]
    assert agent.ask(amount=100, currency="EUR", to="DE89370400440532013000")["decision"] == "deny"


def test_escalation_mentions_the_next_people_and_the_warning_comes_before_expiry(
    channel: FakeSlack, agent: Agent, adam: Person, committed: Any
) -> None:
    in_tenant(
        services.link_user,
        adam.tenant,
        adam.user,
        team_id=channel.team_id,
        slack_user_id="U0ADAM",
        how="confirmed",
        actor=named_actor("t"),
    )
    _open(
        agent,
        committed,
        eligible_roles=["approver"],
        ttl_s=600,
        warn_before_s=120,
        escalation=[{"after_s": 60, "roles": ["admin"]}],
    )
    with committed():
        in_tenant(approvals.sweep, agent.tenant, now=timezone.now() + timedelta(seconds=61))
    message = _message(channel)
    replies = [c for c in channel.called("chat.postMessage") if c.params.get("thread_ts") == message.ts]
    assert (
        len(replies) == 1
        and "<@U0ADAM>" in replies[0].params["text"]
        and "Escalated" in replies[0].params["text"]
    )
    with committed():
        in_tenant(approvals.sweep, agent.tenant, now=timezone.now() + timedelta(seconds=500))
    replies = [c for c in channel.called("chat.postMessage") if c.params.get("thread_ts") == message.ts]
    assert len(replies) == 2 and "expires in about" in replies[1].params["text"]
    with committed():
        in_tenant(approvals.sweep, agent.tenant, now=timezone.now() + timedelta(seconds=601))
    assert "Expired" in json.dumps(_message(channel).blocks) and _actions(_message(channel)) == []


def test_a_request_of_another_tenant_is_not_found_from_slack(
    channel: FakeSlack, agent: Agent, carol: Person, committed: Any
) -> None:
    """carol's tenant has its own request; acme's linked approver names its id: not found in acme."""
    other = Agent(carol.tenant, "", "")
    wire_policy(carol.tenant)
    foreign = other.ask(amount=100)
    assert foreign["decision"] == "pending_approval"
    _click(channel, committed, "approve", foreign["approval_id"], "U0ANN")
    assert "no such approval request" in _ephemerals(channel, "U0ANN")[0]
    with tenant_context(carol.tenant):
        assert ApprovalRequest.objects.get(pk=foreign["approval_id"]).status == Status.PENDING
        assert not Vote.objects.exists()
    assert len(channel.channel_messages("C0RISK")) == 0  # carol's request was never posted in acme's channel
