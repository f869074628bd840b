"""The kill switches' history and the denials view (issue 29, item 3): every halt with how it
ended (lifted by whom, lapsed), the gate's refusals filtered by tool, agent, reason and time,
both keyset-paginated, and another tenant seeing none of it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from core.scoping import tenant_context
from fleet import services as fleet
from fleet.gate import GateRequest
from fleet.inputs import NewHalt
from fleet.models import GateDecision, Halt
from frontend import kill_switch_views
from tenants.actors import api_key_actor, user_actor
from tests.support.factories import Person
from tests.support.scoping import in_statements, in_tenant

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("database_store")]


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def _ask(person: Person, tool: str, agent: str, saga: str) -> dict:
    call = GateRequest(saga_id=saga, step_id="1", tool=tool, args={}, semantics="IRREVERSIBLE", agent=agent)
    return in_statements(fleet.evaluate, person.tenant, call, actor=api_key_actor("test"))


def test_the_history_says_how_each_kill_switch_ended(alice: Person, carol: Person) -> None:
    lifted = in_tenant(
        fleet.halt,
        alice.tenant,
        NewHalt(scope="tool:bank.*", reason="fraud spike"),
        actor=user_actor("alice"),
    )
    in_tenant(fleet.resume, alice.tenant, lifted.pk, actor=user_actor("ann"))
    lapsed = in_tenant(
        fleet.halt,
        alice.tenant,
        NewHalt(scope="agent:bot", reason="runaway", ttl_s=60),
        actor=user_actor("alice"),
    )
    with tenant_context(alice.tenant):
        Halt.objects.filter(pk=lapsed.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    in_tenant(
        fleet.halt,
        alice.tenant,
        NewHalt(scope="*", reason="incident 42", mode="drain"),
        actor=user_actor("bob"),
    )
    body = browser(alice).get("/fleet/halts/history").content.decode()
    states = re.findall(r'data-halt-scope="([^"]+)" data-halt-state="([^"]+)"', body)
    assert states == [("*", "in-force"), ("agent:bot", "expired"), ("tool:bank.*", "lifted")]
    assert "lifted by user:ann" in body and "fraud spike" in body and "by user:bob" in body
    assert "lapsed" in body and "incident 42" in body
    other = browser(carol).get("/fleet/halts/history").content.decode()
    assert "fraud spike" not in other and 'id="no-halt-history"' in other
    assert 'id="halt-history-link"' in browser(alice).get("/fleet/").content.decode()


def test_the_history_pages_by_keyset(alice: Person, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kill_switch_views, "PAGE_SIZE", 2)
    for n in range(5):
        in_tenant(
            fleet.halt, alice.tenant, NewHalt(scope=f"tool:t{n}", reason=f"r{n}"), actor=user_actor("alice")
        )
    client, seen, url = browser(alice), [], "/fleet/halts/history"
    while url:
        body = client.get(url).content.decode()
        seen += re.findall(r'data-halt-scope="tool:(t\d)"', body)
        older = re.search(r'<a href="(\?before=[^"]+)" rel="next">', body)
        url = "/fleet/halts/history" + older.group(1).replace("&amp;", "&") if older else ""
    assert seen == ["t4", "t3", "t2", "t1", "t0"]
    assert client.get("/fleet/halts/history?before=nonsense").status_code == 200


def test_denials_filter_by_tool_agent_reason_and_time(alice: Person, carol: Person) -> None:
    in_tenant(
        fleet.halt,
        alice.tenant,
        NewHalt(scope="tool:bank.*", reason="fraud spike"),
        actor=user_actor("alice"),
    )
    _ask(alice, "bank.wire", "payments-bot", "s1")
    _ask(alice, "bank.refund", "refund-bot", "s2")
    in_tenant(
        fleet.halt,
        alice.tenant,
        NewHalt(scope="agent:mail-bot", reason="spam", mode="halt"),
        actor=user_actor("alice"),
    )
    _ask(alice, "mail.send", "mail-bot", "s3")
    with tenant_context(alice.tenant):
        old = GateDecision.objects.get(saga_id="s2")
        GateDecision.objects.filter(pk=old.pk).update(decided_at=timezone.now() - timedelta(days=3))
    client = browser(alice)

    def tools(**query: str) -> list[str]:
        body = client.get("/fleet/denials/", query).content.decode()
        return re.findall(r'<tr data-reason="[^"]+" data-tool="([^"]+)"', body)

    assert tools() == ["mail.send", "bank.wire", "bank.refund"]
    assert tools(tool="bank.wire") == ["bank.wire"]
    assert tools(agent="refund-bot") == ["bank.refund"]
    assert tools(reason="halted", since="24h") == ["mail.send", "bank.wire"]
    assert tools(reason="rate_limited") == []
    assert "No refusal matches these filters" in client.get("/fleet/denials/", {"tool": "x"}).content.decode()
    assert tools(reason="<script>", since="forever") == ["mail.send", "bank.wire", "bank.refund"]
    assert browser(carol).get("/fleet/denials/").content.decode().count("<tr data-reason") == 0
