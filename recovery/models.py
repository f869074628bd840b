"""Recovery: leases judged by the server's clock, recovery runs, and their jobs.

Invariants (kept by `recovery.actions`, the only writer):
- a `Lease`'s `expires_at` is the server's receive time of the saga's last SAGA_START or
  SAGA_LEASE plus its `lease_ttl` (never the agent's clock);
- at most one unfinished `Run` per saga (active or escalated);
- a `Job`'s `epoch` (its fencing token) only grows, by one on every claim; a result is recorded
  only with the current epoch by a claim that still holds it, so a worker whose job was taken
  from it can never record anything;
- within a run, a job can be claimed only when every job of a later step is finished
  (compensated, resolved or cancelled): strictly newest first. `Run.frontier` holds the ordinal
  of the newest unfinished job, kept under the run's row lock whenever a job finishes.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from core.scoping import TenantScopedModel, tenant_field


class LeaseState(models.TextChoices):
    LIVE = "live", "Held by its agent"
    ENDED = "ended", "Ended by a terminal record"
    SWEPT = "swept", "Expired and taken over by recovery"


class Lease(TenantScopedModel):
    # `one_lease_per_saga` leads with the tenant; a lone tenant index made ingest's lease lookup
    # read a grown tenant's every lease when statistics lagged (155 ms a batch at 10M records).
    tenant = tenant_field(db_index=False)
    saga_id = models.CharField(max_length=128)
    lease_ttl = models.FloatField(null=True, blank=True)
    renewed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=8, choices=LeaseState.choices, default=LeaseState.LIVE)
    swept_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "saga_id"], name="one_lease_per_saga")]
        indexes = [models.Index(fields=["state", "expires_at"], name="recovery_lease_due")]


class RunKind(models.TextChoices):
    CRASH = "crash", "The agent's lease expired"
    ROLLBACK_TO = "rollback_to", "Rollback to a chosen step"


class RunState(models.TextChoices):
    ACTIVE = "active", "Compensating"
    ESCALATED = "escalated", "Waiting for a human"
    DONE = "done", "Finished"
    CANCELLED = "cancelled", "Cancelled (saga quarantined)"


UNFINISHED_RUN_STATES = (RunState.ACTIVE, RunState.ESCALATED)


class Run(TenantScopedModel):
    saga_id = models.CharField(max_length=128)
    kind = models.CharField(max_length=12, choices=RunKind.choices)
    to_ordinal = models.IntegerField(default=0, help_text="compensate the steps after this one (0: all)")
    state = models.CharField(max_length=10, choices=RunState.choices, default=RunState.ACTIVE)
    # The ordinal of the newest unfinished job (0: none): the only one that may be claimed.
    frontier = models.IntegerField(default=0)
    actor = models.CharField(max_length=200)
    lease_expired_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "saga_id"],
                condition=Q(state__in=["active", "escalated"]),
                name="one_unfinished_run_per_saga",
            )
        ]
        indexes = [models.Index(fields=["tenant", "saga_id"], name="recovery_run_saga")]


class JobState(models.TextChoices):
    PENDING = "pending", "Waiting for a worker"
    CLAIMED = "claimed", "Claimed by a worker"
    COMPENSATED = "compensated", "Compensated"
    ESCALATED = "escalated", "Escalated to a human"
    RESOLVED = "resolved", "Resolved by a human"
    CANCELLED = "cancelled", "Cancelled"


FINISHED_JOB_STATES = (JobState.COMPENSATED, JobState.RESOLVED, JobState.CANCELLED)


class Delivery(models.TextChoices):
    WORKER = "worker", "SDK recovery worker"
    WEBHOOK = "webhook", "Tenant webhook"


class Escalation(models.TextChoices):
    NO_HANDLER = "no_handler", "No recoverable compensation"
    IRREVERSIBLE = "irreversible", "Irreversible step"
    RETRIES_EXHAUSTED = "retries_exhausted", "Retries exhausted"
    UNKNOWN_OUTCOME = "unknown_outcome", "Outcome unknown"


class Job(TenantScopedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="jobs")
    saga_id = models.CharField(max_length=128)
    step_id = models.CharField(max_length=128)
    ordinal = models.IntegerField()
    tool = models.CharField(max_length=200, blank=True, default="")
    semantics = models.CharField(max_length=20, blank=True, default="")
    step_status = models.CharField(max_length=24, help_text="the step's projected status when queued")
    handler = models.CharField(max_length=200, blank=True, default="")
    kwargs = models.JSONField(default=dict)
    idempotency_key = models.CharField(max_length=200)
    delivery = models.CharField(max_length=8, choices=Delivery.choices, default=Delivery.WORKER)
    state = models.CharField(max_length=12, choices=JobState.choices, default=JobState.PENDING)
    epoch = models.BigIntegerField(default=0)
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(default=0)
    max_attempts = models.IntegerField(default=5)
    available_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    first_claimed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    escalation = models.CharField(max_length=20, choices=Escalation.choices, blank=True, default="")
    escalated_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True, default="")
    resolved_by = models.CharField(max_length=200, blank=True, default="")
    # Who has taken up an escalated job (acknowledged it, or was handed it): a member who may
    # decide recovery, by username; "" while nobody has (recovery.actions.decisions.assign).
    assignee = models.CharField(max_length=200, blank=True, default="")
    assigned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step_id"], name="one_job_per_step_per_run")]
        indexes = [
            models.Index(fields=["tenant", "state", "available_at"], name="recovery_job_ready"),
            models.Index(fields=["run", "ordinal"], name="recovery_job_order"),
            models.Index(fields=["tenant", "saga_id"], name="recovery_job_saga"),
            models.Index(fields=["state", "lease_expires_at"], name="recovery_job_lease"),
            # The Recovery page's "Recently finished", paged by (finished_at, id): the one list
            # of jobs that grows for ever.
            models.Index(
                fields=["tenant", "finished_at", "id"],
                condition=models.Q(state__in=["compensated", "resolved"]),
                name="recovery_job_finished",
            ),
        ]


class Webhook(TenantScopedModel):
    """Where a tenant wants its compensations delivered instead of to SDK workers: every job whose
    handler matches `handlers` (empty: every handler). The secret signs each delivery."""

    url = models.URLField(max_length=500)
    encrypted_secret = models.TextField()  # MultiFernet token under the master key(s)
    handlers = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=200)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant"], name="one_recovery_webhook_per_tenant")]


class SweepPass(models.Model):
    """When the sweep last finished a pass over every tenant (one row, all tenants together: no
    tenant data). `/metrics`, `/readyz` and the dashboard read its age as the sweep's lag."""

    id = models.SmallIntegerField(primary_key=True, default=1, editable=False)
    finished_at = models.DateTimeField()
    took_s = models.FloatField(default=0.0)
    tenants = models.IntegerField(default=0, help_text="tenants with recovery work due in the pass")
    failures = models.IntegerField(default=0, help_text="tenants whose sweep raised in the pass")

    def __str__(self) -> str:
        return f"sweep pass finished {self.finished_at.isoformat()}"
