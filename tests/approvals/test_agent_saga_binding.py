"""agent-saga's approval requests are bound like the gate's own (issue 23, item 3): the requester
is the creator of the key that shipped the record, who cannot vote (403 requester_cannot_vote);
the request is bound to the digest of its action, and another action under a known request id
is refused, kept as evidence (APPROVAL_CONFLICT) and never answered GRANTED by GET /v1/approvals.

Before: no requester was recorded, so the owner who created the shipping key approved their own
request (201); a second APPROVAL_REQUESTED with the same request id and another context (amount
5 -> 5000000, to alice -> mallory) was accepted and GET /v1/approvals still answered GRANTED."""

from __future__ import annotations

import time
from typing import Any

import pytest
from rest_framework.test import APIClient
from sagaplane.chain import GENESIS, stamp

from approvals.models import ApprovalRequest, Status
from core.scoping import tenant_context
from tests.support.chains import server_stream
from tests.support.factories import Person

pytestmark = pytest.mark.django_db(transaction=True)

HONEST = {"amount": 5, "to": "alice"}
SWAPPED = {"amount": 5_000_000, "to": "mallory"}


class Wal:
    """An agent-saga agent's WAL, chained as agent-saga chains it, shipped to /v1/wal/ingest."""

    def __init__(self, client: APIClient) -> None:
        self.client, self.head, self.seq = client, GENESIS, 0
        self.ship("SAGA_START", saga_id="payout-1", name="payout")

    def ship(self, event: str, **fields: Any) -> None:
        self.seq += 1
        record = {"seq": self.seq, "ts": round(time.time(), 6), "event": event, **fields}
        self.head = stamp(record, self.head)
        response = self.client.post("/v1/wal/ingest", {"records": [record]}, format="json")
        assert response.status_code == 200, response.content

    def ask(self, request_id: str, context: dict[str, Any]) -> None:
        self.ship(
            "APPROVAL_REQUESTED",
            request_id=request_id,
            tool="bank.wire",
            rule="wires",
            reason="a wire needs risk's approval",
            context=context,
            expires_at=time.time() + 600,
        )


def _key_made_by(person: Person) -> APIClient:
    """A key `person` created from the API (so they are its creator), as an agent uses it."""
    created = person.session_client().post(
        "/api/v1/keys", {"name": "payout-agent", "scopes": ["ingest", "read"]}, format="json"
    )
    assert created.status_code == 201, created.content
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created.json()['key']}")
    return client


def _request(person: Person, external_id: str) -> ApprovalRequest:
    with tenant_context(person.tenant):
        return ApprovalRequest.objects.get(external_id=external_id)


def _vote(person: Person, row: ApprovalRequest) -> Any:
    return person.session_client().post(
        f"/api/v1/approvals/{row.pk}/votes", {"choice": "approve"}, format="json"
    )


def _pulled(agent: APIClient, status: str) -> dict[str, str]:
    answer = agent.get(f"/v1/approvals?status={status}")
    assert answer.status_code == 200, answer.content
    return {item["id"]: item["status"] for item in answer.json()["approvals"]}


def test_the_creator_of_the_shipping_key_cannot_approve_its_request(alice: Person, ann: Person) -> None:
    agent = _key_made_by(alice)
    Wal(agent).ask("r-own", HONEST)
    row = _request(alice, "r-own")
    refused = _vote(alice, row)
    assert refused.status_code == 403 and refused.json()["error"] == "requester_cannot_vote"
    assert _vote(ann, row).status_code == 201
    assert _pulled(agent, "granted") == {"r-own": "GRANTED"}
    (requested,) = [r for r in server_stream(alice.tenant) if r["event"] == "APPROVAL_REQUESTED"]
    assert requested["requester"] == f"user:{alice.user.get_username()}"
    assert requested["api_key"] == row.api_key_prefix != ""


def test_a_key_nobody_created_excludes_nobody_and_says_so(alice: Person) -> None:
    agent = alice.key_client()  # made by services.create_api_key with no creator (as the CLI does)
    Wal(agent).ask("r-cli", HONEST)
    (requested,) = [r for r in server_stream(alice.tenant) if r["event"] == "APPROVAL_REQUESTED"]
    assert "requester" in requested and requested["requester"] is None
    assert _vote(alice, _request(alice, "r-cli")).status_code == 201


def test_another_action_under_a_pending_request_id_is_refused_and_never_granted(
    alice: Person, ann: Person
) -> None:
    agent = _key_made_by(alice)
    wal = Wal(agent)
    wal.ask("r-swap", HONEST)
    honest = _request(alice, "r-swap")
    wal.ask("r-swap", SWAPPED)  # the ingest stores the record (evidence); the request refuses it
    row = _request(alice, "r-swap")
    assert (row.status, row.decided_by, row.action_digest) == (
        Status.DENIED,
        "system:conflict",
        honest.action_digest,
    )
    assert row.args == HONEST
    voted = _vote(ann, row)
    assert voted.status_code == 409 and voted.json()["error"] == "already_decided"
    assert "r-swap" not in _pulled(agent, "granted")
    assert _pulled(agent, "all")["r-swap"] == "DENIED"
    (conflict,) = [r for r in server_stream(alice.tenant) if r["event"] == "APPROVAL_CONFLICT"]
    assert conflict["approval_id"] == row.pk and conflict["action_digest"] == honest.action_digest
    assert conflict["refused_action"]["arguments"] == SWAPPED
    assert conflict["refused_action_digest"] != honest.action_digest


def test_another_action_under_an_approved_request_id_withdraws_the_grant(alice: Person, ann: Person) -> None:
    agent = _key_made_by(alice)
    wal = Wal(agent)
    wal.ask("r-late", HONEST)
    assert _vote(ann, _request(alice, "r-late")).status_code == 201
    assert _pulled(agent, "granted") == {"r-late": "GRANTED"}
    wal.ask("r-late", SWAPPED)
    assert _pulled(agent, "granted") == {}
    assert _pulled(agent, "all") == {"r-late": "DENIED"}
    wal.ask("r-late", HONEST)  # the same record again changes nothing more
    assert _pulled(agent, "all") == {"r-late": "DENIED"}
    events = [r["event"] for r in server_stream(alice.tenant) if r.get("approval_id")]
    assert events.count("APPROVAL_CONFLICT") == 1 and events[-1] == "APPROVAL_DENIED"
