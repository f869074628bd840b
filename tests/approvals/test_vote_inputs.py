"""A member's vote and passkey challenge as typed inputs (approvals/inputs.py): `/votes` refuses
what it refused before, in the one error shape naming the same field, with the same precedence
(the body and break_glass, then the request's 404, then choice, note and the break-glass reason);
`/challenge` reads break_glass as leniently as before. Written against the hand-parsed views first."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.approvals import Agent, wire_policy
from tests.support.factories import Person

pytestmark = pytest.mark.django_db

NOBODY = "apr_nobody"
BODY = (400, "invalid", "the body must be a JSON object", "body")
GLASS = (400, "invalid", "break_glass: true or false", "break_glass")
NOT_FOUND = (404, "not_found", "no such approval request", None)
CHOICE = (400, "invalid", "choice: approve or deny", "choice")
NOTE = (400, "invalid", "note: a string of at most 1000 characters", "note")
REASON = (400, "reason_required", "break-glass approves, with a written reason", "note")


def _shape(answer: Any) -> tuple[int, str, str, str | None]:
    body = answer.json()
    return answer.status_code, body["error"], body["detail"], body.get("field")


def test_a_vote_is_refused_by_field_with_the_same_precedence(agent: Agent, ann: Person) -> None:
    wire_policy(agent.tenant)
    approval = agent.ask(amount=100)["approval_id"]
    client = ann.session_client()
    cases: list[tuple[str, Any, tuple[int, str, str, str | None]]] = [
        (approval, [{"choice": "approve"}], BODY),
        (approval, "approve", BODY),
        (NOBODY, ["x"], BODY),  # the body before the request's 404
        (approval, {"choice": "approve", "break_glass": "yes"}, GLASS),
        (approval, {"choice": "approve", "break_glass": 1}, GLASS),
        (approval, {"choice": "approve", "break_glass": None}, GLASS),
        (NOBODY, {"choice": "approve", "break_glass": "yes"}, GLASS),  # break_glass before the 404
        (NOBODY, {"choice": "maybe"}, NOT_FOUND),  # the 404 before choice and note
        (NOBODY, {"choice": "approve", "note": 5}, NOT_FOUND),
        (NOBODY, {"choice": "deny", "break_glass": True}, NOT_FOUND),
        (approval, {}, CHOICE),
        (approval, {"choice": "maybe"}, CHOICE),
        (approval, {"choice": "APPROVE"}, CHOICE),
        (approval, {"choice": ["approve"]}, CHOICE),
        (approval, {"choice": None}, CHOICE),
        (approval, {"choice": "maybe", "note": 5}, CHOICE),  # choice before note
        (approval, {"choice": "approve", "note": 5}, NOTE),
        (approval, {"choice": "approve", "note": "x" * 1001}, NOTE),
        (approval, {"choice": "approve", "note": "a\x00b"}, NOTE),
        (approval, {"choice": "approve", "note": 5, "break_glass": True}, NOTE),  # note before reason
        (approval, {"choice": "deny", "note": "why", "break_glass": True}, REASON),
        (approval, {"choice": "approve", "note": "  ", "break_glass": True}, REASON),
        (approval, {"choice": "approve", "break_glass": True}, REASON),
    ]
    for approval_id, body, expected in cases:
        answer = client.post(f"/api/v1/approvals/{approval_id}/votes", body, format="json")
        assert _shape(answer) == expected, body
    assert client.get(f"/api/v1/approvals/{approval}").json()["votes"] == []  # nothing counted
    voted = client.post(
        f"/api/v1/approvals/{approval}/votes",
        {"choice": "approve", "note": None, "break_glass": False, "other": 1},
        format="json",
    )
    assert voted.status_code == 201 and voted.json()["status"] == "approved"
    assert [v["note"] for v in client.get(f"/api/v1/approvals/{approval}").json()["votes"]] == [""]


def test_a_challenge_reads_break_glass_leniently(agent: Agent, ann: Person) -> None:
    wire_policy(agent.tenant, passkey_only=True)
    approval = agent.ask(amount=100)["approval_id"]
    client = ann.session_client()
    url = f"/api/v1/approvals/{approval}/challenge"
    # Only `true` asks for a break-glass challenge (which an approver may not have); anything
    # else, a body that is no object, or a form's "true", is an ordinary one, as before.
    glass = client.post(url, {"break_glass": True}, format="json")
    assert _shape(glass)[:2] == (403, "break_glass_forbidden")
    for body in ({}, {"break_glass": "true"}, {"break_glass": 1}, {"break_glass": None}, [True], "x"):
        issued = client.post(url, body, format="json")
        assert issued.status_code == 201 and len(issued.json()["challenge"]) == 64, body
    assert client.post(url, {"break_glass": "true"}).status_code == 201  # a form's field
    assert client.post(url).status_code == 201  # no body at all
    missing = client.post(f"/api/v1/approvals/{NOBODY}/challenge", ["x"], format="json")
    assert _shape(missing) == NOT_FOUND
