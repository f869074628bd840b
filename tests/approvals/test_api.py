"""The approvals API: policies (scope `control`, or owners and admins), the queue, a request's
detail, votes by people only, the long-poll, break-glass review; hostile input is a 4xx in the
error shape; another tenant sees nothing."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.approvals import Agent, wire_policy
from tests.support.factories import Person

pytestmark = pytest.mark.django_db

POLICY = {
    "name": "large wires",
    "tool": "bank.*",
    "semantics": ["IRREVERSIBLE"],
    "predicates": [
        {"arg": "amount", "op": ">", "value": 10000},
        {
            "any": [
                {"arg": "currency", "op": "in", "value": ["USD", "EUR"]},
                {"arg": "to", "op": "domain_not_in", "value": ["acme.example"]},
            ]
        },
    ],
    "required_approvals": 2,
    "eligible_roles": ["approver", "admin"],
    "passkey_only": False,
    "ttl_s": 3600,
    "execution_window_s": 600,
    "warn_before_s": 600,
    "escalation": [{"after_s": 1800, "roles": ["owner"]}],
}


def test_policies_through_the_api(alice: Person, bob: Person, carol: Person) -> None:
    client = alice.key_client()
    created = client.post("/api/v1/approvals/policies", POLICY, format="json")
    assert created.status_code == 201, created.content
    policy = created.json()
    assert policy["version"] == 1 and policy["predicates"] == POLICY["predicates"]
    changed = alice.session_client().patch(
        f"/api/v1/approvals/policies/{policy['id']}", {"required_approvals": 3}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["version"] == 2
    assert (
        bob.session_client()
        .patch(f"/api/v1/approvals/policies/{policy['id']}", {}, format="json")
        .status_code
        == 403
    )
    assert [p["name"] for p in bob.session_client().get("/api/v1/approvals/policies").json()] == [
        "large wires"
    ]
    assert carol.key_client().get("/api/v1/approvals/policies").json() == []
    assert carol.key_client().get(f"/api/v1/approvals/policies/{policy['id']}").status_code == 404
    taken = client.post("/api/v1/approvals/policies", POLICY, format="json")
    assert taken.status_code == 409 and taken.json()["error"] == "name_taken"
    status = client.get("/api/v1/fleet/status").json()
    assert "bank.*" in status["governed_tools"]
    assert client.delete(f"/api/v1/approvals/policies/{policy['id']}").status_code == 204


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"predicates": "amount > 10000"}, "predicates"),
        ({"predicates": [{"arg": "amount", "op": "eval", "value": 1}]}, "predicates"),
        ({"required_approvals": 0}, "required_approvals"),
        ({"required_approvals": True}, "required_approvals"),
        ({"ttl_s": 10**12}, "ttl_s"),
        ({"eligible_roles": ["god"]}, "eligible_roles"),
        ({"eligible_members": ["nobody@nowhere.example"]}, "eligible_members"),
        ({"escalation": [{"after_s": 10**9}]}, "escalation[0].after_s"),
        ({"semantics": ["SOMETIMES"]}, "semantics"),
        ({"tool": ""}, "tool"),
        ({"name": "x" * 101}, "name"),
        ({"unknown": 1}, "unknown"),
        ({"passkey_only": "yes"}, "passkey_only"),
        ({"actor": "user:someone-else"}, "actor"),
        ({"tenant": 2}, "tenant"),
    ],
)
def test_a_bad_policy_is_a_400_naming_its_field(alice: Person, change: dict[str, Any], field: str) -> None:
    response = alice.key_client().post("/api/v1/approvals/policies", {**POLICY, **change}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field


def test_the_queue_a_vote_and_the_long_poll(agent: Agent, ann: Person, carol: Person, alice: Person) -> None:
    wire_policy(agent.tenant)
    pending = agent.ask(amount=100)
    approval = pending["approval_id"]
    queue = ann.session_client().get("/api/v1/approvals?status=pending").json()
    assert [r["id"] for r in queue] == [approval] and queue[0]["args"] == {"amount": 100}
    agent_client = agent_client_for(agent)
    started = time.monotonic()
    waited = agent_client.get(f"/api/v1/approvals/{approval}/wait?timeout=0.3").json()
    assert waited["status"] == "pending" and time.monotonic() - started >= 0.3
    # People vote; agents cannot (not even their key's owner's key).
    assert (
        agent_client.post(
            f"/api/v1/approvals/{approval}/votes", {"choice": "approve"}, format="json"
        ).status_code
        == 403
    )
    refused = alice.session_client().post(
        f"/api/v1/approvals/{approval}/votes", {"choice": "approve"}, format="json"
    )
    assert refused.status_code == 403 and refused.json()["error"] == "requester_cannot_vote"
    assert (
        carol.session_client()
        .post(f"/api/v1/approvals/{approval}/votes", {"choice": "approve"}, format="json")
        .status_code
        == 404
    )
    bad = ann.session_client().post(f"/api/v1/approvals/{approval}/votes", {"choice": "maybe"}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "choice"
    voted = ann.session_client().post(
        f"/api/v1/approvals/{approval}/votes", {"choice": "approve", "note": "ok"}, format="json"
    )
    assert voted.status_code == 201 and voted.json()["status"] == "approved"
    started = time.monotonic()
    waited = agent_client.get(f"/api/v1/approvals/{approval}/wait?timeout=20").json()
    assert waited["status"] == "approved" and time.monotonic() - started < 5  # answered at once
    detail = ann.session_client().get(f"/api/v1/approvals/{approval}").json()
    assert [v["voter"] for v in detail["votes"]] == ["user:ann@acme.example"] and detail["rules"][
        "required"
    ] == 1
    # Another tenant sees nothing of it.
    assert carol.key_client().get(f"/api/v1/approvals/{approval}").status_code == 404
    assert carol.key_client().get(f"/api/v1/approvals/{approval}/wait").status_code == 404
    assert carol.key_client().get("/api/v1/approvals").json() == []
    assert carol.key_client().get("/api/v1/approvals/break-glass").json() == []


def agent_client_for(agent: Agent) -> Any:
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.raw_key}")
    return client


@pytest.mark.parametrize("timeout", ["-1", "nan", "inf", "abc", "9" * 50])
def test_a_bad_timeout_is_a_400(agent: Agent, timeout: str) -> None:
    wire_policy(agent.tenant)
    approval = agent.ask(amount=100)["approval_id"]
    response = agent_client_for(agent).get(f"/api/v1/approvals/{approval}/wait?timeout={timeout}")
    assert response.status_code == 400 and response.json()["field"] == "timeout"


def test_a_passkey_challenge_over_the_api(agent: Agent, ann: Person) -> None:
    wire_policy(agent.tenant, passkey_only=True)
    approval = agent.ask(amount=100)["approval_id"]
    plain = ann.session_client().post(
        f"/api/v1/approvals/{approval}/votes", {"choice": "approve"}, format="json"
    )
    assert plain.status_code == 403 and plain.json()["error"] == "passkey_required"
    issued = ann.session_client().post(f"/api/v1/approvals/{approval}/challenge", {}, format="json")
    assert issued.status_code == 201 and len(issued.json()["challenge"]) == 64
    assert issued.json()["action"]["arguments"] == {"amount": 100}
