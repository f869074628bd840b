"""Saga and step state, projected from audit records (never written by anything but
`sagas.services`). Everything here can be rebuilt from the records: `manage.py rebuild_sagas`."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.utils import timezone

from core.scoping import TenantScopedModel, tenant_field

AGENT_NAME_MAX = 100


class SagaStatus(models.TextChoices):
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    ROLLED_BACK = "rolled_back", "Rolled back"
    ROLLBACK_PARTIAL = "rollback_partial", "Rollback partial (needs a human)"
    ORPHANED = "orphaned", "Orphaned"
    QUARANTINED = "quarantined", "Quarantined"
    # The agent's lease expired (or a human chose "rollback to here") and recovery is compensating
    # its steps (RECOVERY_STARTED / RECOVERY_ESCALATED in the server stream; ROLLBACK_END ends it).
    RECOVERING = "recovering", "Recovering"


TERMINAL_STATUSES = frozenset(
    {SagaStatus.COMPLETED, SagaStatus.ROLLED_BACK, SagaStatus.ROLLBACK_PARTIAL, SagaStatus.QUARANTINED}
)


class StepStatus(models.TextChoices):
    INTENT = "intent", "Intent written"
    COMMITTED = "committed", "Committed"
    UNKNOWN = "unknown", "Outcome unknown"
    COMPENSATED = "compensated", "Compensated"
    COMPENSATION_FAILED = "compensation_failed", "Compensation failed"
    ORPHANED = "orphaned", "Orphaned"


class Saga(TenantScopedModel):
    # No index of its own: `saga_id_per_tenant` (tenant, saga_id) and the list's indexes lead with
    # it. A lone tenant index is one more write per saga and, with statistics older than the
    # tenant's growth, the plan Postgres picked for the projection's read by saga ids (scanning
    # the tenant: 231 ms a batch instead of 13 at 2M records).
    tenant = tenant_field(db_index=False)
    saga_id = models.CharField(max_length=128)
    name = models.CharField(max_length=200, blank=True, default="")
    stream_id = models.CharField(max_length=200)
    # The name the agent gave itself (SAGA_START's `agent`, e.g. "billing-bot"), shown beside the
    # stream id, which is an opaque identifier of the WAL.
    agent = models.CharField(max_length=AGENT_NAME_MAX, blank=True, default="")
    # `status` holds what the records say; a running saga whose lease lapsed is reported as
    # orphaned by `effective_status` (time passing is not a record, so it is not projected).
    status = models.CharField(max_length=20, choices=SagaStatus.choices, default=SagaStatus.RUNNING)
    started_at = models.DateTimeField(null=True, blank=True)
    last_activity_at = models.DateTimeField(null=True, blank=True)
    last_lease_at = models.DateTimeField(null=True, blank=True)
    lease_ttl = models.FloatField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    last_event = models.CharField(max_length=64, blank=True, default="")
    record_count = models.IntegerField(default=0)
    first_leaf_index = models.BigIntegerField(null=True, blank=True)
    last_leaf_index = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "saga_id"], name="saga_id_per_tenant")]
        # The list's order is (last activity, id) newest first and it pages by keyset on that pair
        # (sagas.api), so each index ends with it: a page is one index range, whatever the
        # tenant's size, unfiltered (`activity`) or filtered by recorded status (`status`).
        indexes = [
            models.Index(fields=["tenant", "status", "last_activity_at", "id"], name="sagas_saga_status_act"),
            models.Index(fields=["tenant", "last_activity_at", "id"], name="sagas_saga_activity_id"),
        ]

    def effective_status(self, now: datetime | None = None) -> str:
        now = now or timezone.now()
        if (
            self.status == SagaStatus.RUNNING
            and self.lease_expires_at is not None
            and self.lease_expires_at < now
        ):
            return SagaStatus.ORPHANED
        return self.status


class Step(TenantScopedModel):
    # Neither has an index of its own: `sagas_step_tool_saga` leads with the tenant and
    # `step_id_per_saga` with the saga (see Saga.tenant).
    tenant = tenant_field(db_index=False)
    saga = models.ForeignKey(Saga, on_delete=models.CASCADE, related_name="steps", db_index=False)
    step_id = models.CharField(max_length=128)
    ordinal = models.IntegerField(help_text="order of first appearance within the saga, from 1")
    tool = models.CharField(max_length=200, blank=True, default="")
    semantics = models.CharField(max_length=20, blank=True, default="")
    status = models.CharField(max_length=24, choices=StepStatus.choices, default=StepStatus.INTENT)
    compensation = models.JSONField(null=True, blank=True)
    first_leaf_index = models.BigIntegerField()
    last_leaf_index = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["saga", "step_id"], name="step_id_per_saga")]
        # (tenant, tool, saga): the sagas that used a tool, from the index alone (the list's tool
        # filter is an EXISTS on steps; per saga it probes `step_id_per_saga`).
        indexes = [models.Index(fields=["tenant", "tool", "saga"], name="sagas_step_tool_saga")]
