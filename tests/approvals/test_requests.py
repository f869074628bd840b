"""Approval requests through the gate: bound to the exact action, decided once, consumed once.

The reuse attack (approve wire(100), then ask wire(1000000)), a second effect from one approval,
an approval that lapsed before execution; who may vote; M-of-N; deny; break-glass; passkey-only;
deadlines with a warning first; escalation; budgets that escalate; every record carries the saga
id so the saga's disclosure counts it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from approvals import hooks, selectors
from approvals import services as approvals
from approvals.models import ApprovalRequest, Status
from core.errors import DomainError
from core.scoping import tenant_context
from fleet import services as fleet
from tenants.actors import named_actor, user_actor
from tests.support.approvals import Agent, member, vote, wire_policy
from tests.support.chains import server_stream
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from transparency import sources

pytestmark = pytest.mark.django_db


def _records(person: Person, event: str) -> list[dict[str, Any]]:
    return [r for r in server_stream(person.tenant) if r.get("event") == event]


def test_a_small_wire_needs_nobody_and_a_large_one_waits(agent: Agent) -> None:
    wire_policy(agent.tenant)
    assert agent.ask(amount=10)["decision"] == "allow"
    pending = agent.ask(amount=100)
    assert pending["decision"] == "pending_approval" and pending["reason"] == "approval_required"
    assert len(pending["approval_id"]) == 32 and pending["required"] == 1
    assert pending["wait"] == f"/api/v1/approvals/{pending['approval_id']}/wait"
    # A retried step finds its request (nothing new opened or recorded).
    assert agent.ask(amount=100)["approval_id"] == pending["approval_id"]
    with tenant_context(agent.tenant):
        assert ApprovalRequest.objects.count() == 1
    # The tools a policy governs are in the fleet status (the SDK asks the gate for them).
    with tenant_context(agent.tenant):
        assert "bank.*" in fleet.governed_tools()


def test_the_reuse_attack_and_a_second_effect_are_refused(agent: Agent, alice: Person, ann: Person) -> None:
    wire_policy(agent.tenant)
    small = agent.ask(amount=100)
    vote(ann, small["approval_id"])
    allowed = agent.ask(amount=100)
    assert allowed["decision"] == "allow" and allowed["approvals"] == [small["approval_id"]]
    # A retry of that very call gets the same authorisation back (one effect).
    assert agent.ask(amount=100) == allowed
    # The same saga and step asking a million: another action, another request.
    big = agent.ask(amount=1_000_000)
    assert big["decision"] == "pending_approval" and big["approval_id"] != small["approval_id"]
    # Another effect from the same approval (same call, another idempotency key): refused.
    again = agent.ask(amount=100, key="second-effect")
    assert again["decision"] == "deny" and again["reason"] == "approval_consumed"
    with tenant_context(agent.tenant):
        row = ApprovalRequest.objects.get(pk=small["approval_id"])
        assert row.status == Status.CONSUMED and row.authorization_id == allowed["authorization_id"]
    consumed = _records(alice, "APPROVAL_CONSUMED")
    assert [r["approval_id"] for r in consumed] == [small["approval_id"]]
    assert consumed[0]["authorization_id"] == allowed["authorization_id"] and consumed[0]["saga_id"] == "s1"


def test_an_approval_not_used_in_its_execution_window_is_refused(agent: Agent, ann: Person) -> None:
    wire_policy(agent.tenant, execution_window_s=60)
    pending = agent.ask(amount=100)
    vote(ann, pending["approval_id"])
    with tenant_context(agent.tenant):
        ApprovalRequest.objects.filter(pk=pending["approval_id"]).update(
            execute_by=timezone.now() - timedelta(seconds=1)
        )
    refused = agent.ask(amount=100)
    assert refused["decision"] == "deny" and refused["reason"] == "approval_expired"
    assert in_tenant(approvals.sweep, agent.tenant)["lapsed"] == 1
    assert agent.ask(amount=100)["reason"] == "approval_expired"


def test_the_requester_cannot_approve_and_others_must_be_eligible(
    agent: Agent, alice: Person, bob: Person, ann: Person
) -> None:
    wire_policy(agent.tenant, eligible_roles=["approver"])
    pending = agent.ask(amount=100)
    for person, code in ((alice, "requester_cannot_vote"), (bob, "not_eligible")):
        with pytest.raises(DomainError) as refused:
            vote(person, pending["approval_id"])
        assert refused.value.code == code
    assert agent.ask(amount=100)["decision"] == "pending_approval"
    vote(ann, pending["approval_id"])
    assert agent.ask(amount=100)["decision"] == "allow"


def test_a_member_of_another_tenant_cannot_vote_and_sees_nothing(agent: Agent, carol: Person) -> None:
    wire_policy(agent.tenant)
    pending = agent.ask(amount=100)
    with pytest.raises(DomainError) as refused:
        in_tenant(
            approvals.vote,
            agent.tenant,
            pending["approval_id"],
            member(carol),
            "approve",
            actor=user_actor("carol"),
        )
    assert refused.value.status == 403
    with pytest.raises(DomainError) as unknown:
        vote(carol, pending["approval_id"])  # in her own tenant there is no such request
    assert unknown.value.status == 404
    with tenant_context(carol.tenant):
        assert selectors.requests() == [] and fleet.governed_tools() == []
    assert agent.ask(amount=100)["decision"] == "pending_approval"


def test_m_of_n_one_vote_each_and_an_eligible_deny_denies(
    agent: Agent, alice: Person, ann: Person, ben: Person, adam: Person
) -> None:
    wire_policy(agent.tenant, required_approvals=2)
    first = agent.ask(amount=100)
    vote(ann, first["approval_id"])
    with pytest.raises(DomainError) as twice:
        vote(ann, first["approval_id"])
    assert twice.value.code == "already_voted"
    assert agent.ask(amount=100)["approvals"] == 1
    row = vote(ben, first["approval_id"])
    assert row.status == Status.APPROVED and row.approvals == 2
    with pytest.raises(DomainError) as late:
        vote(adam, first["approval_id"], "deny")
    assert late.value.code == "already_decided"
    assert agent.ask(amount=100)["decision"] == "allow"

    other = agent.ask(amount=200, saga="s2")
    vote(ann, other["approval_id"])
    vote(ben, other["approval_id"], "deny", "not this vendor")
    denied = agent.ask(amount=200, saga="s2")
    assert denied["decision"] == "deny" and denied["reason"] == "approval_denied"
    assert denied["note"] == "not this vendor"
    decided = [
        (r["event"], r["saga_id"])
        for r in server_stream(alice.tenant)
        if r["event"] in ("APPROVAL_GRANTED", "APPROVAL_DENIED")
    ]
    assert decided == [("APPROVAL_GRANTED", "s1"), ("APPROVAL_DENIED", "s2")]


def test_break_glass_is_for_owners_with_a_reason_and_is_listed(
    agent: Agent, alice: Person, adam: Person, tenant_a: Any
) -> None:
    from tests.support.factories import make_person

    olga = make_person(tenant_a, "olga", "owner")
    wire_policy(agent.tenant, required_approvals=3)
    pending = agent.ask(amount=100)
    with pytest.raises(DomainError) as admin:
        vote(adam, pending["approval_id"], note="urgent", break_glass=True)
    assert admin.value.code == "break_glass_forbidden"
    with pytest.raises(DomainError) as silent:
        vote(olga, pending["approval_id"], break_glass=True)
    assert silent.value.code == "reason_required"
    with pytest.raises(DomainError) as requester:
        vote(alice, pending["approval_id"], note="mine", break_glass=True)
    assert requester.value.code == "requester_cannot_vote"
    row = vote(olga, pending["approval_id"], note="payroll deadline, bank closes at 5", break_glass=True)
    assert row.status == Status.APPROVED and row.break_glass
    assert agent.ask(amount=100)["decision"] == "allow"
    with tenant_context(agent.tenant):
        uses = selectors.break_glass_uses()
    assert [(u["approval_id"], u["note"], u["voter"]) for u in uses] == [
        (pending["approval_id"], "payroll deadline, bank closes at 5", "user:olga@acme.example")
    ]
    glass = _records(alice, "APPROVAL_BREAK_GLASS")
    assert len(glass) == 1 and glass[0]["requires_review"] is True and glass[0]["saga_id"] == "s1"


def test_passkey_only_policies_take_a_verified_assertion_on_a_fresh_challenge(
    agent: Agent, ann: Person, ben: Person
) -> None:
    wire_policy(agent.tenant, passkey_only=True)
    pending = agent.ask(amount=100)
    assert pending["passkey_only"] is True
    with pytest.raises(DomainError) as bare:
        vote(ann, pending["approval_id"])
    assert bare.value.code == "passkey_required"
    issued = in_tenant(
        approvals.issue_vote_challenge,
        ann.tenant,
        pending["approval_id"],
        member(ann),
        actor=user_actor("ann"),
    )
    with tenant_context(agent.tenant):
        digest = ApprovalRequest.objects.get(pk=pending["approval_id"]).action_digest
    assert issued["challenge"] == approvals.challenge_for(digest, bytes.fromhex(issued["nonce"]))
    # Ben cannot answer ann's challenge.
    with pytest.raises(DomainError) as stolen:
        vote(ben, pending["approval_id"], assertion={"challenge": issued["challenge"], "credential_id": "x"})
    assert stolen.value.code == "challenge_invalid"
    assertion = {"challenge": issued["challenge"], "credential_id": "cred-1", "signature": "c2ln"}
    row = vote(ann, pending["approval_id"], assertion=assertion)
    assert row.status == Status.APPROVED
    with tenant_context(agent.tenant):
        assert row.votes.get().assertion == {**assertion, "nonce": issued["nonce"]}
    assert agent.ask(amount=100)["decision"] == "allow"


def test_a_challenge_is_used_once(agent: Agent, ann: Person, ben: Person) -> None:
    wire_policy(agent.tenant, passkey_only=True, required_approvals=2)
    pending = agent.ask(amount=100)
    issued = in_tenant(
        approvals.issue_vote_challenge,
        ann.tenant,
        pending["approval_id"],
        member(ann),
        actor=user_actor("ann"),
    )
    vote(ann, pending["approval_id"], assertion={"challenge": issued["challenge"]})
    with tenant_context(agent.tenant):
        ApprovalRequest.objects.filter(pk=pending["approval_id"]).update(approvals=0)
        ann_vote = ApprovalRequest.objects.get(pk=pending["approval_id"]).votes.get()
        ann_vote.delete()
    with pytest.raises(DomainError) as replayed:
        vote(ann, pending["approval_id"], assertion={"challenge": issued["challenge"]})
    assert replayed.value.code == "challenge_invalid"


def test_the_deadline_denies_and_approvers_were_warned_first(
    agent: Agent, alice: Person, django_capture_on_commit_callbacks: Any
) -> None:
    seen: list[tuple[str, str]] = []
    hook = hooks.on_approval_event(lambda event: seen.append((event.kind, event.request["status"])))
    try:
        wire_policy(agent.tenant, ttl_s=600, warn_before_s=120)
        pending = agent.ask(amount=100)
        start = timezone.now()
        callbacks = django_capture_on_commit_callbacks(execute=True)
        callbacks.__enter__()
        assert in_tenant(approvals.sweep, agent.tenant, now=start + timedelta(seconds=100)) == {
            "expired": 0,
            "warned": 0,
            "escalated": 0,
            "lapsed": 0,
        }
        assert in_tenant(approvals.sweep, agent.tenant, now=start + timedelta(seconds=500))["warned"] == 1
        assert (
            in_tenant(approvals.sweep, agent.tenant, now=start + timedelta(seconds=550))["warned"] == 0
        )  # once
        assert in_tenant(approvals.sweep, agent.tenant, now=start + timedelta(seconds=601))["expired"] == 1
        callbacks.__exit__(None, None, None)
    finally:
        hooks._hooks.remove(hook)
    refused = agent.ask(amount=100)
    assert refused["decision"] == "deny" and refused["reason"] == "approval_expired"
    events = [
        r["event"]
        for r in server_stream(alice.tenant)
        if r["event"].startswith("APPROVAL_") and "POLICY" not in r["event"]
    ]
    assert events == ["APPROVAL_REQUESTED", "APPROVAL_WARNING", "APPROVAL_EXPIRED"]
    assert ("warned", "pending") in seen and ("decided", "expired") in seen
    assert seen.index(("warned", "pending")) < seen.index(("decided", "expired"))
    assert pending["approval_id"]


def test_escalation_widens_who_may_approve(agent: Agent, ann: Person, adam: Person) -> None:
    wire_policy(agent.tenant, eligible_roles=["admin"], escalation=[{"after_s": 60, "roles": ["approver"]}])
    pending = agent.ask(amount=100)
    with pytest.raises(DomainError):
        vote(ann, pending["approval_id"])
    assert (
        in_tenant(approvals.sweep, agent.tenant, now=timezone.now() + timedelta(seconds=61))["escalated"] == 1
    )
    assert vote(ann, pending["approval_id"]).status == Status.APPROVED
    escalated = _records(ann, "APPROVAL_ESCALATED")
    assert escalated[0]["level"] == 1 and escalated[0]["roles"] == ["approver"]


def test_a_budget_that_escalates_opens_a_request_instead_of_denying(agent: Agent, ann: Person) -> None:
    in_tenant(
        fleet.create_budget,
        agent.tenant,
        fleet.BudgetCreate.parse(
            {"name": "daily", "tool": "bank.*", "max_total": 1000, "window_s": 86400, "on_cap": "escalate"}
        ),
        actor=named_actor("test"),
    )
    assert agent.ask(amount=900)["decision"] == "allow"
    over = agent.ask(amount=500, saga="s2")
    assert over["decision"] == "pending_approval" and over["policy"] == "daily"
    vote(ann, over["approval_id"])
    allowed = agent.ask(amount=500, saga="s2")
    assert allowed["decision"] == "allow" and allowed["approvals"] == [over["approval_id"]]
    # The approved overspend was debited: the next call is over the cap again and escalates.
    assert agent.ask(amount=1, saga="s3")["decision"] == "pending_approval"
    # A budget that denies still denies.
    in_tenant(
        fleet.create_budget,
        agent.tenant,
        fleet.BudgetCreate.parse({"name": "hard", "tool": "crm.*", "max_total": 10, "window_s": 60}),
        actor=named_actor("test"),
    )
    assert agent.ask("crm.refund", amount=20, saga="s4")["reason"] == "budget_exceeded"


def test_every_record_of_a_request_is_part_of_its_sagas_disclosure(agent: Agent, ann: Person) -> None:
    wire_policy(agent.tenant)
    pending = agent.ask(amount=100, saga="saga-with-approval")
    vote(ann, pending["approval_id"])
    agent.ask(amount=100, saga="saga-with-approval")
    with tenant_context(agent.tenant):
        events = [leaf.record["event"] for leaf in sources.saga_records(agent.tenant, "saga-with-approval")]
    assert events == ["APPROVAL_REQUESTED", "APPROVAL_VOTE", "APPROVAL_GRANTED", "APPROVAL_CONSUMED"]


def test_editing_a_policy_moves_its_version_and_records_old_and_new(
    agent: Agent, alice: Person, ann: Person
) -> None:
    policy = wire_policy(agent.tenant)
    before = agent.ask(amount=100)
    updated = in_tenant(
        approvals.update_policy,
        agent.tenant,
        policy.pk,
        approvals.PolicyChange.parse({"required_approvals": 2}),
        actor=user_actor("alice"),
    )
    assert updated.version == 2
    after = agent.ask(amount=100)
    assert after["approval_id"] != before["approval_id"] and after["required"] == 2
    change = _records(alice, "APPROVAL_POLICY_UPDATED")[0]
    assert change["old"]["required_approvals"] == 1 and change["new"]["required_approvals"] == 2
    assert change["old"]["version"] == 1 and change["new"]["version"] == 2
    with pytest.raises(DomainError) as bad:
        in_tenant(
            approvals.update_policy,
            agent.tenant,
            policy.pk,
            approvals.PolicyChange.parse({"predicates": "amount > 1"}),
            actor=user_actor("alice"),
        )
    assert bad.value.code == "invalid_predicate"
    in_tenant(approvals.delete_policy, agent.tenant, policy.pk, actor=user_actor("alice"))
    assert agent.ask(amount=100, saga="s9")["decision"] == "allow"
    assert _records(alice, "APPROVAL_POLICY_DELETED")[0]["old"]["name"] == "large wires"


def test_the_beat_task_sweeps_every_tenant(agent: Agent, carol: Person) -> None:
    from django.conf import settings

    from approvals import tasks

    assert settings.CELERY_BEAT_SCHEDULE["approvals-sweep"]["task"] == tasks.sweep.name
    wire_policy(agent.tenant, ttl_s=60, warn_before_s=10)
    wire_policy(carol.tenant, ttl_s=60, warn_before_s=10)
    mine = agent.ask(amount=100)
    with tenant_context(agent.tenant):
        ApprovalRequest.objects.filter(pk=mine["approval_id"]).update(expires_at=timezone.now())
    assert tasks.sweep.apply().get() == {"expired": 1, "warned": 0, "escalated": 0, "lapsed": 0}
    assert agent.ask(amount=100)["reason"] == "approval_expired"
