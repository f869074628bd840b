"""The approval pages over HTTP: the queue and a request in full, passkey votes signed by a software
authenticator (real ES256), the hostile variants refused with nothing decided, break-glass, history,
and the kept assertions verifying offline with the SDK."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from sagaplane.approval import verify_vote_record

from approvals.models import ApprovalRequest, Status, Vote
from core.scoping import tenant_context
from passkeys import services as passkeys
from tenants.actors import named_actor
from tenants.models import Role, Tenant
from tests.passkeys.authenticator import ORIGIN, SoftAuthenticator, b64url
from tests.support.approvals import Agent, wire_policy
from tests.support.chains import server_stream
from tests.support.factories import Person, make_person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("database_store")]


class Approver:
    """A person at the dashboard (http://localhost:8000) with a passkey on a software authenticator."""

    def __init__(self, person: Person, auth: SoftAuthenticator | None = None) -> None:
        self.person = person
        self.client = Client(HTTP_HOST="localhost:8000")
        self.client.force_login(person.user)
        self.auth = auth or SoftAuthenticator()
        options = passkeys.registration_options(person.user)
        passkeys.register(
            person.user, "key", self.auth.create(options), origins=[ORIGIN], actor=named_actor("test")
        )

    def challenge(self, approval_id: str, **form: Any) -> dict[str, Any]:
        answer = self.client.post(f"/approvals/{approval_id}/challenge", form)
        assert answer.status_code == 200, answer.content
        return answer.json()

    def post_vote(self, approval_id: str, assertion: dict[str, Any], nonce: str, **form: Any) -> Any:
        data = {"decision": "approve", "credential": json.dumps(assertion), "nonce": nonce, **form}
        return self.client.post(f"/approvals/{approval_id}/vote", data, HTTP_ACCEPT="application/json")

    def vote(self, approval_id: str, **get: Any) -> Any:
        issued = self.challenge(approval_id)
        assertion = self.auth.get(issued["publicKey"]["challenge"], **get)
        return self.post_vote(approval_id, assertion, issued["nonce"])


def pending_wire(agent: Agent, amount: int = 250_000, saga: str = "s1") -> str:
    answer = agent.ask(amount=amount, to="ACME GmbH", currency="EUR", saga=saga)
    assert answer["decision"] == "pending_approval", answer
    return str(answer["approval_id"])


def state(tenant: Tenant, approval_id: str) -> tuple[str, int, int]:
    with tenant_context(tenant):
        row = ApprovalRequest.objects.get(pk=approval_id)
        return row.status, row.approvals, Vote.objects.filter(request=row).count()


def test_the_queue_and_the_request_show_the_action_in_full(agent: Agent, ann: Person) -> None:
    wire_policy(agent.tenant, required_approvals=2, passkey_only=True)
    approval_id = pending_wire(agent)
    client = Approver(ann).client
    queue = client.get("/approvals/").content.decode()
    assert f'data-approval="{approval_id}"' in queue and 'data-live-url="/approvals/rows"' in queue
    assert f'data-approval="{approval_id}"' in client.get("/approvals/rows").content.decode()
    # The time left reads as people say it ("in 59 minutes"), its instant in the title, not ISO text.
    left = re.search(r'<time datetime="[^"]+" title="[^"]+ UTC" data-relative>([^<]+)</time>', queue)
    assert left is not None and left.group(1).startswith("in "), queue
    page = client.get(f"/approvals/{approval_id}/").content.decode()
    for shown in ("bank.wire", "250000", "ACME GmbH", "EUR", "large wires", "0 of 2", "passkey only", "s1"):
        assert shown in page, shown
    with tenant_context(agent.tenant):
        assert ApprovalRequest.objects.get(pk=approval_id).action_digest in page
    assert "data-passkey-vote" in page and "Approve with passkey" in page


def test_two_approvers_approve_with_passkeys_and_the_votes_verify_offline(
    agent: Agent, ann: Person, ben: Person
) -> None:
    wire_policy(agent.tenant, required_approvals=2, passkey_only=True)
    approval_id = pending_wire(agent)
    anns, bens = Approver(ann), Approver(ben)
    issued = anns.challenge(approval_id)
    options = issued["publicKey"]
    assert options["userVerification"] == "required" and options["rpId"] == "localhost"
    assert [c["id"] for c in options["allowCredentials"]] == [b64url(anns.auth.credential_id)]

    first = anns.post_vote(approval_id, anns.auth.get(options["challenge"]), issued["nonce"])
    assert first.status_code == 200, first.content
    assert state(agent.tenant, approval_id) == (Status.PENDING, 1, 1)
    live = bens.client.get(f"/approvals/{approval_id}/state").content.decode()
    assert "1 of 2" in live and 'data-voter="user:ann@acme.example"' in live and "passkey" in live
    assert agent.ask(amount=250_000, to="ACME GmbH", currency="EUR")["decision"] == "pending_approval"
    second = bens.vote(approval_id)
    assert second.json()["status"] == Status.APPROVED
    assert agent.ask(amount=250_000, to="ACME GmbH", currency="EUR")["decision"] == "allow"

    votes = [r for r in server_stream(agent.tenant) if r["event"] == "APPROVAL_VOTE"]
    assert [v["voter"] for v in votes] == ["user:ann@acme.example", "user:ben@acme.example"]
    for record in votes:
        verified = verify_vote_record(record)
        assert verified.approval_id == approval_id and verified.algorithm == "ES256"
    assert approval_id not in anns.client.get("/approvals/rows").content.decode()
    history = anns.client.get("/approvals/history/").content.decode()
    assert f'data-approval="{approval_id}"' in history


def test_hostile_passkey_votes_are_refused_and_decide_nothing(
    agent: Agent, alice: Person, ann: Person, ben: Person, carol: Person
) -> None:
    wire_policy(agent.tenant, required_approvals=2, passkey_only=True)
    target = pending_wire(agent, saga="s1")
    other = pending_wire(agent, saga="s2")
    anns, bens = Approver(ann), Approver(ben)

    def refused(answer: Any, code: str, status: int) -> None:
        assert (answer.status_code, answer.json()["error"]) == (status, code), answer.content
        assert state(agent.tenant, target) == (Status.PENDING, 0, 0)

    # Signed for another request's challenge (its own nonce), posted to this one.
    issued = anns.challenge(other)
    refused(
        anns.post_vote(target, anns.auth.get(issued["publicKey"]["challenge"]), issued["nonce"]),
        "challenge_invalid",
        403,
    )
    # ... or with this request's nonce claimed beside it.
    mine = anns.challenge(target)
    refused(
        anns.post_vote(target, anns.auth.get(anns.challenge(other)["publicKey"]["challenge"]), mine["nonce"]),
        "challenge_invalid",
        403,
    )
    # A lower sign counter, no user verification, another origin: the passkey check refuses.
    anns.auth.sign_count = 10
    assert anns.vote(target).status_code == 200  # counter 11 stored ...
    with tenant_context(agent.tenant):
        Vote.objects.filter(request_id=target).delete()
        ApprovalRequest.objects.filter(pk=target).update(approvals=0)
    refused(anns.vote(target, counter=5), "assertion_refused", 400)
    refused(anns.vote(target, uv=False), "assertion_refused", 400)
    refused(anns.vote(target, origin="https://evil.example"), "assertion_refused", 400)
    # Another member's credential answering ann's challenge.
    issued = anns.challenge(target)
    refused(
        anns.post_vote(target, bens.auth.get(issued["publicKey"]["challenge"]), issued["nonce"]),
        "not_your_passkey",
        403,
    )
    # Replayed: an authenticator without a counter (0 every time) sends the same assertion twice;
    # the nonce was consumed by the first.
    ben_zero = bens
    issued = ben_zero.challenge(target)
    assertion = ben_zero.auth.get(issued["publicKey"]["challenge"], counter=0)
    assert ben_zero.post_vote(target, assertion, issued["nonce"]).status_code == 200
    with tenant_context(agent.tenant):
        Vote.objects.filter(request_id=target).delete()
        ApprovalRequest.objects.filter(pk=target).update(approvals=0)
    refused(ben_zero.post_vote(target, assertion, issued["nonce"]), "challenge_invalid", 403)
    # Junk instead of a credential.
    refused(anns.post_vote(target, {"id": 1}, mine["nonce"]), "malformed_credential", 400)
    # Without a passkey on a passkey-only policy.
    answer = anns.client.post(
        f"/approvals/{target}/vote", {"decision": "approve"}, HTTP_ACCEPT="application/json"
    )
    refused(answer, "passkey_required", 403)
    # The requester (the asking key's owner) gets no challenge; another tenant's owner finds nothing.
    requester = Client(HTTP_HOST="localhost:8000")
    requester.force_login(alice.user)
    assert requester.post(f"/approvals/{target}/challenge").json()["error"] == "requester_cannot_vote"
    outsider = Client(HTTP_HOST="localhost:8000")
    outsider.force_login(carol.user)
    assert outsider.get(f"/approvals/{target}/").status_code == 404
    assert outsider.post(f"/approvals/{target}/vote", {"decision": "approve"}).status_code == 404
    assert state(agent.tenant, target) == (Status.PENDING, 0, 0)


def test_break_glass_is_an_owners_with_a_reason_and_listed_for_review(
    agent: Agent, ann: Person, tenant_a: Tenant
) -> None:
    wire_policy(agent.tenant, required_approvals=3)
    approval_id = pending_wire(agent)
    olga = make_person(tenant_a, "olga", Role.OWNER)
    owner = Client(HTTP_HOST="localhost:8000")
    owner.force_login(olga.user)
    assert "Break glass" in owner.get(f"/approvals/{approval_id}/").content.decode()
    assert "Break glass" not in Approver(ann).client.get(f"/approvals/{approval_id}/").content.decode()

    answer = owner.post(f"/approvals/{approval_id}/vote", {"break_glass": "1", "note": " "}, follow=True)
    assert b"written reason" in answer.content
    assert state(agent.tenant, approval_id) == (Status.PENDING, 0, 0)
    refused = Approver(ann).client.post(
        f"/approvals/{approval_id}/vote",
        {"break_glass": "1", "note": "me too"},
        HTTP_ACCEPT="application/json",
    )
    assert refused.json()["error"] == "break_glass_forbidden"

    owner.post(
        f"/approvals/{approval_id}/vote", {"break_glass": "1", "note": "payroll deadline, CFO on phone"}
    )
    assert state(agent.tenant, approval_id)[0] == Status.APPROVED
    records = [r for r in server_stream(agent.tenant) if r["event"] == "APPROVAL_BREAK_GLASS"]
    assert len(records) == 1 and records[0]["note"] == "payroll deadline, CFO on phone"
    history = owner.get("/approvals/history/").content.decode()
    assert 'id="break-glass-list"' in history and "payroll deadline, CFO on phone" in history


def test_viewers_see_but_do_not_vote(agent: Agent, tenant_a: Tenant) -> None:
    wire_policy(agent.tenant)
    approval_id = pending_wire(agent)
    viewer = make_person(tenant_a, "vera", Role.VIEWER)
    client = Client(HTTP_HOST="localhost:8000")
    client.force_login(viewer.user)
    page = client.get(f"/approvals/{approval_id}/").content.decode()
    assert "bank.wire" in page and 'id="vote-form"' not in page
    assert client.post(f"/approvals/{approval_id}/vote", {"decision": "approve"}).status_code == 403
    assert client.post(f"/approvals/{approval_id}/challenge").status_code == 403
    assert state(agent.tenant, approval_id) == (Status.PENDING, 0, 0)


def test_admins_set_approval_policies_from_the_page_and_everyone_sees_them(
    alice: Person, ann: Person, tenant_a: Tenant
) -> None:
    from approvals.models import ApprovalPolicy

    owner = Client()
    owner.force_login(alice.user)
    form = {
        "name": "large wires",
        "tool": "bank.*",
        "semantics": ["IRREVERSIBLE"],
        "conditions": "1",
        "c0_arg": "amount",
        "c0_op": ">",
        "c0_value": "10,000",
        "required_approvals": "2",
        "eligible_roles": ["approver", "owner"],
        "eligible_members": "ann@acme.example",
        "passkey_only": "on",
        "ttl_minutes": "30",
        "execution_window_minutes": "2",
        "warn_before_minutes": "5",
        "levels": "1",
        "e0_after": "10",
        "e0_roles": ["admin"],
    }
    bad = owner.post("/approvals/policies/create", {**form, "c0_value": "lots"})
    assert bad.status_code == 400 and b"predicates[0].value: a finite number" in bad.content
    assert b"large wires" in bad.content and b'value="lots"' in bad.content  # the form as typed
    unknown = owner.post("/approvals/policies/create", {**form, "c0_op": "~"})
    assert unknown.status_code == 400
    with tenant_context(tenant_a):
        assert not ApprovalPolicy.objects.exists()

    assert owner.post("/approvals/policies/create", form).status_code == 302
    with tenant_context(tenant_a):
        policy = ApprovalPolicy.objects.get()
    assert (policy.tool, policy.semantics, policy.required_approvals) == ("bank.*", ["IRREVERSIBLE"], 2)
    assert (policy.passkey_only, policy.ttl_s, policy.execution_window_s) == (True, 1800, 120)
    assert policy.eligible_members == [ann.user.pk] and policy.escalation[0]["roles"] == ["admin"]
    assert policy.predicates == [{"arg": "amount", "op": ">", "value": 10000}]
    assert policy.escalation[0]["after_s"] == 600
    created = [r for r in server_stream(tenant_a) if r["event"] == "APPROVAL_POLICY_CREATED"]
    assert created[-1]["actor"] == f"user:{alice.user.email}" and created[-1]["new"]["name"] == "large wires"

    approver = Client()
    approver.force_login(ann.user)
    listing = approver.get("/approvals/policies/").content.decode()
    assert 'data-policy="large wires"' in listing and 'id="policy-form"' not in listing
    assert approver.post("/approvals/policies/create", {**form, "name": "mine"}).status_code == 403
    assert approver.post(f"/approvals/policies/{policy.pk}/delete").status_code == 403

    owner.post(f"/approvals/policies/{policy.pk}/toggle")
    with tenant_context(tenant_a):
        assert ApprovalPolicy.objects.get().enabled is False
    owner.post(f"/approvals/policies/{policy.pk}/delete")
    assert owner.post(f"/approvals/policies/{policy.pk}/delete").status_code == 404
    with tenant_context(tenant_a):
        assert not ApprovalPolicy.objects.exists()
