"""Approvals: who must say yes before an effect, the requests the gate opens, and the votes.

Invariants (kept by `approvals.services`, the only writer):
- a request is bound to one exact action: its id is derived from the tenant, saga, step, tool and
  the SHA-256 of the canonical action (tool, arguments, amount, policy and its version), so a call
  with other arguments, or under an edited policy, is another request;
- a request is decided once (pending → approved | denied | expired); an approved request starts
  at most one effect: the gate call that starts it moves it to consumed in the transaction that
  writes the authorisation, inside its execution window, or not at all;
- one vote per member per request (the first counts); the requester never votes.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from core.scoping import TenantScopedModel


class ApprovalPolicy(TenantScopedModel):
    """Calls to tools matching `tool` (a glob), of one of `semantics` (empty: any), whose arguments
    satisfy every predicate, need `required_approvals` yes votes from the eligible group."""

    name = models.CharField(max_length=100)
    tool = models.CharField(max_length=200, default="*")
    semantics = models.JSONField(default=list)  # e.g. ["IRREVERSIBLE"]; [] matches any
    predicates = models.JSONField(default=list)  # approvals.predicates (validated, never eval'd)
    required_approvals = models.PositiveSmallIntegerField(default=1)
    eligible_roles = models.JSONField(default=list)  # e.g. ["approver", "admin", "owner"]
    eligible_members = models.JSONField(default=list)  # user ids
    passkey_only = models.BooleanField(default=False)
    ttl_s = models.PositiveIntegerField(default=3600)  # time to decide, from the request
    execution_window_s = models.PositiveIntegerField(default=300)  # time to start, from the approval
    warn_before_s = models.PositiveIntegerField(default=300)  # approvers warned this long before expiry
    escalation = models.JSONField(default=list)  # [{"after_s", "roles", "members"}], ascending after_s
    enabled = models.BooleanField(default=True)
    version = models.PositiveIntegerField(default=1)  # +1 on every edit
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="approval_policy_name_per_tenant")
        ]

    def __str__(self) -> str:
        return self.name


class PolicyVersion(TenantScopedModel):
    """One version of an approval policy as it was written: its terms (`policy_values`), who made
    it and when. Written with the change, in its transaction; kept when the policy is deleted (the
    requests it opened name its versions)."""

    policy_pk = models.PositiveIntegerField()
    version = models.PositiveIntegerField()
    terms = models.JSONField(default=dict)
    actor = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "policy_pk", "version"], name="one_row_per_policy_version"
            )
        ]


class Status(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    DENIED = "denied", "Denied"
    EXPIRED = "expired", "Expired"
    CONSUMED = "consumed", "Consumed (its effect started)"
    LAPSED = "lapsed", "Lapsed (approved, not started in its window)"


class Source(models.TextChoices):
    POLICY = "policy", "An approval policy"
    BUDGET = "budget", "A budget at its cap (on_cap=escalate)"
    AGENT_SAGA = "agent-saga", "An agent-saga APPROVAL_REQUESTED record"


class ApprovalRequest(TenantScopedModel):
    """One exact action waiting for (or holding) a decision."""

    id = models.CharField(primary_key=True, max_length=64)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.POLICY)
    external_id = models.CharField(max_length=128, blank=True, default="")  # agent-saga's request id
    saga_id = models.CharField(max_length=128)
    step_id = models.CharField(max_length=128)
    tool = models.CharField(max_length=200)
    semantics = models.CharField(max_length=32, blank=True, default="")
    args = models.JSONField(default=dict)
    args_digest = models.CharField(max_length=64)
    action = models.JSONField(default=dict)  # what the digest is the SHA-256 of (canonical form)
    action_digest = models.CharField(max_length=64)
    policy = models.ForeignKey(ApprovalPolicy, null=True, blank=True, on_delete=models.SET_NULL)
    policy_name = models.CharField(max_length=100, blank=True, default="")
    policy_version = models.PositiveIntegerField(default=0)
    rules = models.JSONField(default=dict)  # the policy's terms as they were (required, eligible, ...)
    limits = models.JSONField(default=list)  # budgets whose cap an approval lifts (source=budget)
    agent = models.CharField(max_length=100, blank=True, default="")
    reason = models.CharField(max_length=500, blank=True, default="")  # the requester's, shown first
    api_key_prefix = models.CharField(max_length=12, blank=True, default="")
    requester_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    idempotency_key = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    required = models.PositiveSmallIntegerField(default=1)
    approvals = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    warned_at = models.DateTimeField(null=True, blank=True)
    escalation_level = models.PositiveSmallIntegerField(default=0)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=200, blank=True, default="")
    note = models.CharField(max_length=1000, blank=True, default="")
    break_glass = models.BooleanField(default=False)
    execute_by = models.DateTimeField(null=True, blank=True)  # approved: start the effect before this
    consumed_at = models.DateTimeField(null=True, blank=True)
    authorization_id = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "status", "expires_at"], name="approvals_open"),
            models.Index(fields=["tenant", "saga_id", "step_id"], name="approvals_by_step"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "external_id"],
                condition=~models.Q(external_id=""),
                name="one_request_per_external_id",
            )
        ]


class VoteChoice(models.TextChoices):
    APPROVE = "approve", "Approve"
    DENY = "deny", "Deny"


class Vote(TenantScopedModel):
    """One member's answer to one request (the first counts; a second is refused)."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="votes")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    voter = models.CharField(max_length=200)  # "user:<email>" as the records name people
    role = models.CharField(max_length=16)
    choice = models.CharField(max_length=8, choices=VoteChoice.choices)
    note = models.CharField(max_length=1000, blank=True, default="")
    break_glass = models.BooleanField(default=False)
    assertion = models.JSONField(null=True, blank=True)  # a verified passkey assertion, kept whole
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["request", "user"], name="one_vote_per_member")]


class VoteChallenge(TenantScopedModel):
    """A single-use server nonce for one member's passkey vote on one request. The WebAuthn
    challenge is SHA-256(action digest ‖ nonce): an assertion signs exactly this action."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    nonce = models.CharField(max_length=64)
    challenge = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
