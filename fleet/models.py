"""Fleet controls: the policies the pre-flight gate enforces, and its durable ledger.

Invariants (kept by `fleet.services`, the only writer):
- a `GateDecision` with decision "allow" is permanent: its debits are spent whatever the step
  later does (the effect happened in the world), and the fast store (Redis) can always be rebuilt
  from these rows;
- one decision per (tenant, idempotency key): a retried gate call gets the first answer back and
  debits nothing more;
- `LimitCounter` and `RateState` are the database store's counters (embedded mode, or
  SAGAPLANE_GATE_STORE=database); with Redis they stay empty.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.utils import timezone

from core.scoping import TenantScopedModel
from fleet.gate import from_units


class OnCap(models.TextChoices):
    DENY = "deny", "Deny the call"
    ESCALATE = "escalate", "Escalate to an approval"


class BudgetLimit(TenantScopedModel):
    """At most `max_total` of the numeric argument `argument` over any `window_s` seconds, for calls
    to tools matching `tool` (a glob), counted separately for each value of `per`."""

    name = models.CharField(max_length=100)
    tool = models.CharField(max_length=200, default="*")
    argument = models.CharField(max_length=100, default="amount")
    max_total = models.DecimalField(max_digits=20, decimal_places=4)
    window_s = models.PositiveIntegerField()
    # [] (the whole fleet), or any of "agent", "api_key", "tool", "arg:<name>", in this order.
    per = models.JSONField(default=list)
    on_cap = models.CharField(max_length=10, choices=OnCap.choices, default=OnCap.DENY)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="budget_name_per_tenant")]

    def __str__(self) -> str:
        return self.name


class RateLimit(TenantScopedModel):
    """At most `max_calls` calls over `window_s` seconds (GCRA: smooth, O(1) per check), for tools
    matching `tool`, counted separately for each value of `per`."""

    name = models.CharField(max_length=100)
    tool = models.CharField(max_length=200, default="*")
    max_calls = models.PositiveIntegerField()
    window_s = models.PositiveIntegerField()
    per = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="rate_limit_name_per_tenant")]

    def __str__(self) -> str:
        return self.name


class HaltMode(models.TextChoices):
    HALT = "halt", "Halt: refuse every matching call"
    DRAIN = "drain", "Drain: refuse new sagas, let running ones finish"


class Halt(TenantScopedModel):
    """A kill switch in force from `created_at` until lifted or `expires_at`."""

    scope = models.CharField(max_length=200)  # "*", "tool:<glob>", "tag:<t>", "agent:<name>"
    mode = models.CharField(max_length=8, choices=HaltMode.choices, default=HaltMode.HALT)
    reason = models.CharField(max_length=500)
    actor = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["tenant", "lifted_at"], name="fleet_halt_in_force")]


class Quarantine(TenantScopedModel):
    """One saga set aside: the gate refuses its steps and recovery skips it, until released."""

    saga_id = models.CharField(max_length=128)
    reason = models.CharField(max_length=500)
    actor = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)
    # Set aside before any record of the saga arrived (asked for explicitly: `preemptive: true`).
    preemptive = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["tenant", "saga_id"], name="fleet_quarantine_saga")]


class Decision(models.TextChoices):
    ALLOW = "allow", "Allowed"
    DENY = "deny", "Denied"
    PENDING_APPROVAL = "pending_approval", "Pending approval"


class Source(models.TextChoices):
    """Who refused: the gate (a decision it answered), or the agent's SDK on its own view (a halt
    or open breaker in its last fleet state, an unreachable control plane, a tool outside its
    policy), known from the GATE_DENY record its WAL shipped (`fleet.actions.agent_denials`)."""

    SERVER = "server", "Gate"
    AGENT = "agent", "Agent's SDK"


class GateDecision(TenantScopedModel):
    """One answer of the gate. Allowed decisions are the budget ledger (never deleted); denials are
    kept for the dashboard's recent denials."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    idempotency_key = models.CharField(max_length=200)
    saga_id = models.CharField(max_length=128)
    step_id = models.CharField(max_length=128)
    tool = models.CharField(max_length=200)
    agent = models.CharField(max_length=100, blank=True, default="")
    api_key_prefix = models.CharField(max_length=12, blank=True, default="")
    args_digest = models.CharField(max_length=64)
    decision = models.CharField(max_length=20, choices=Decision.choices)
    reason = models.CharField(max_length=40, blank=True, default="")
    detail = models.JSONField(default=dict)
    # [{"key": <counter key>, "limit": <name>, "kind": "budget" | "rate", "amount": <str>}]
    debits = models.JSONField(default=list)
    decided_at = models.DateTimeField(default=timezone.now)
    # A refusal the agent's SDK made on its own is projected here from its shipped GATE_DENY
    # (source "agent", with the WAL's stream); the database defaults keep the gate's one-statement
    # insert (fleet.queries) unchanged.
    source = models.CharField(
        max_length=10, choices=Source.choices, default=Source.SERVER, db_default=Source.SERVER.value
    )
    stream_id = models.CharField(max_length=200, blank=True, default="", db_default="")

    class Meta:
        constraints = [
            # Only allows are idempotent: a refusal debits nothing, so a retry is simply asked again
            # (a halt lifted or a window passed since may allow it now).
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=models.Q(decision="allow"),
                name="one_allow_per_idempotency_key",
            )
        ]
        indexes = [
            models.Index(fields=["tenant", "decision", "decided_at"], name="fleet_decision_recent"),
            # A saga's open reservations, read when its end is ingested (fleet.actions.reservations).
            models.Index(
                fields=["tenant", "saga_id"],
                condition=models.Q(detail__reservation__state="open"),
                name="fleet_open_reservations",
            ),
        ]

    def answer(self) -> dict[str, Any]:
        """The gate's JSON answer for this decision (the same for every retry)."""
        if self.decision == Decision.ALLOW:
            return allow_answer(self.id, self.detail)
        # A refusal names its row: the agent's GATE_DENY record keeps the answer, so the
        # projection of shipped refusals knows the gate already has this one.
        return {
            "decision": Decision(self.decision).value,
            "reason": self.reason,
            **self.detail,
            "decision_id": str(self.id),
        }


def allow_answer(decision_id: uuid.UUID, detail: dict[str, Any]) -> dict[str, Any]:
    """An allow's answer from its row's id and detail (the gate's lean path answers from these
    without building the row)."""
    answer: dict[str, Any] = {"decision": "allow", "authorization_id": str(decision_id)}
    if detail.get("approvals"):
        answer["approvals"] = list(detail["approvals"])  # the approvals it consumed
    if detail.get("reservation"):
        answer["reservation"] = _reservation_answer(decision_id, detail["reservation"])
    return answer


def reservation_answer(row: GateDecision) -> dict[str, Any]:
    """A reservation as answers show it (ARCHITECTURE §8.3): its id (the authorisation's), state,
    the estimate reserved and, once settled, the actual amount and the overrun (what the actual
    exceeded the reserve by, counted against every budget it debited)."""
    return _reservation_answer(row.id, row.detail["reservation"])


def _reservation_answer(decision_id: uuid.UUID, held: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "id": str(decision_id),
        "state": held["state"],
        "reserved": from_units(int(held["reserved"])),
    }
    if held["state"] == "settled":
        actual = int(held["actual"])
        answer["actual"] = from_units(actual)
        answer["overrun"] = from_units(max(0, actual - int(held["reserved"])))
        answer["settled_by"] = held.get("settled_by", "")
    return answer


class LimitCounter(TenantScopedModel):
    """Database store: the amount debited to one counter key in one time bucket."""

    key = models.CharField(max_length=200)
    bucket = models.BigIntegerField()
    amount = models.BigIntegerField(default=0)  # in 1/10,000 units (fleet.gate.SCALE)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key", "bucket"], name="one_counter_per_bucket")
        ]


class RateState(TenantScopedModel):
    """Database store: a rate limit key's GCRA theoretical arrival time (ms since the epoch)."""

    key = models.CharField(max_length=200)
    tat_ms = models.FloatField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "key"], name="one_rate_state_per_key")]


class FleetLock(TenantScopedModel):
    """One row per tenant, locked by the database store so that check-and-debit is atomic."""

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant"], name="one_fleet_lock_per_tenant")]


class BreakerState(models.TextChoices):
    CLOSED = "closed", "Closed: calls go through, their outcomes are counted"
    OPEN = "open", "Open: every matching call is refused"
    HALF_OPEN = "half_open", "Half-open: one trial call is let through"


class CircuitBreaker(TenantScopedModel):
    """A fleet-wide circuit breaker for tools matching `tool` (a glob), fed by the step outcomes
    agents ship: it opens after `consecutive_failures` failures in a row, or when at least
    `min_volume` calls over `window_s` failed at `failure_rate` or more; after `cool_down_s` the
    gate lets one trial call through (half-open), whose success closes it and failure re-opens it.
    `generation` names one closed period: its outcomes are counted under it, and a close (or a
    change of the thresholds) starts a new one, so counts never carry over."""

    name = models.CharField(max_length=100)
    tool = models.CharField(max_length=200)
    consecutive_failures = models.PositiveIntegerField()
    failure_rate = models.DecimalField(max_digits=5, decimal_places=4)
    min_volume = models.PositiveIntegerField()
    window_s = models.PositiveIntegerField()
    cool_down_s = models.PositiveIntegerField()
    state = models.CharField(max_length=10, choices=BreakerState.choices, default=BreakerState.CLOSED)
    generation = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(null=True, blank=True)
    # The half-open trial: the call the gate let through, and when (a trial whose outcome never
    # arrives lapses after cool_down_s, and another is let through).
    trial_saga_id = models.CharField(max_length=128, blank=True, default="")
    trial_step_id = models.CharField(max_length=128, blank=True, default="")
    trial_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="breaker_name_per_tenant")]

    def __str__(self) -> str:
        return self.name


class BreakerTransition(TenantScopedModel):
    """One change of a breaker's state, with why and who (its history; the audit record of the
    same transaction holds the same)."""

    breaker = models.ForeignKey(CircuitBreaker, on_delete=models.CASCADE, related_name="transitions")
    old_state = models.CharField(max_length=10, choices=BreakerState.choices)
    new_state = models.CharField(max_length=10, choices=BreakerState.choices)
    reason = models.CharField(max_length=300)
    actor = models.CharField(max_length=200)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["tenant", "breaker", "at"], name="fleet_breaker_history")]


class BreakerTally(TenantScopedModel):
    """Database store: one breaker generation's outcomes (embedded mode; with Redis it stays
    empty): the failures in a row, and calls and failures per time bucket {bucket: [calls, failures]}."""

    key = models.CharField(max_length=200)
    consecutive = models.PositiveIntegerField(default=0)
    buckets = models.JSONField(default=dict)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "key"], name="one_breaker_tally_per_key")]


class LeaseState(models.TextChoices):
    OUTSTANDING = "outstanding", "Outstanding: every granted unit counted"
    RETURNED = "returned", "Returned: what was used counted, the rest given back"
    SETTLED = "settled", "Settled after expiry: what its holder's shipped WAL proves used counted"


class GateLease(TenantScopedModel):
    """Budget units granted to one agent ahead of its calls (ARCHITECTURE §8.3, leases): debited from
    the counters at the grant, all or none, so that spent + every outstanding lease never exceeds a
    cap. Part of the ledger: an outstanding lease counts every granted unit (also once it has
    expired, until returned), a returned one what its holder reported used; rebuilds and usage read
    it so. Never deleted."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    saga_id = models.CharField(max_length=128)  # the saga whose call asked for it
    tool = models.CharField(max_length=200)
    agent = models.CharField(max_length=100, blank=True, default="")
    api_key_prefix = models.CharField(max_length=12, blank=True, default="")
    # As GateDecision.debits, `amount` the units granted, plus `per_call` (one call's amount) and
    # `bucket` (the window bucket the grant was debited to, where unused units are given back).
    debits = models.JSONField(default=list)
    used = models.JSONField(null=True, blank=True)  # units used, one per debit, once returned
    state = models.CharField(max_length=12, choices=LeaseState.choices, default=LeaseState.OUTSTANDING)
    granted_ms = models.BigIntegerField()  # the limit store's clock at the grant
    granted_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    returned_at = models.DateTimeField(null=True, blank=True)
    # Settlement of a lease its holder never returned (`fleet.actions.lease_settlement`, leased
    # work claimed through `core.claims`): due at `settle_after` (its expiry plus a grace for the
    # holder's WAL to ship), which a claim moves on by the claim's lease; `settle_token` is the
    # claim's fencing token, `settler` who holds it.
    settle_after = models.DateTimeField(null=True, blank=True)
    settle_token = models.BigIntegerField(default=0)
    settler = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "granted_at"], name="fleet_lease_granted"),
            models.Index(
                fields=["settle_after"],
                condition=models.Q(state="outstanding"),
                name="fleet_lease_settle_due",
            ),
        ]

    def counted(self) -> list[int]:
        """Units each debit holds in the counters: all granted while outstanding, else those used."""
        if self.state == LeaseState.OUTSTANDING or self.used is None:
            return [int(d["amount"]) for d in self.debits]
        return [int(u) for u in self.used]


class FleetSettings(TenantScopedModel):
    """The tenant's settings of the gate (at most one row; none: every default). Changed only by
    `fleet.services.set_fleet_settings`, recorded with old and new values."""

    # How long a budget lease lives unless renewed (ARCHITECTURE §8.3); None: the deployment's
    # SAGAPLANE_LEASE_TTL_MS (1 s).
    lease_ttl_ms = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant"], name="one_fleet_settings_per_tenant")]


class LeaseUse(TenantScopedModel):
    """One decision an agent's SDK took on a budget lease, as its shipped WAL proves it: a
    GATE_ALLOW record naming the lease, counted in the ingest transaction that stores the record
    (`fleet.actions.lease_settlement.watch_appended`). What a lease its holder never returned is
    settled at. `debits`: {limit name: units} as the record said (amounts that are not amounts
    left out). No foreign key: a record may name a lease that does not exist (never counted). Not
    evidence (the record is, in the evidence store): deleted a day after it was received once its
    lease is no longer outstanding (`prune_uses`, ARCHITECTURE §8.3)."""

    lease_id = models.UUIDField()
    saga_id = models.CharField(max_length=128, blank=True, default="")
    debits = models.JSONField(default=dict)
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "lease_id"], name="fleet_lease_use_lease"),
            models.Index(fields=["tenant", "received_at"], name="fleet_lease_use_received"),
        ]
