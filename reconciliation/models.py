"""Reconciliation checks: one per compensated step, asking its observer whether the effect is
really reversed, and a per-tenant watermark of the log leaves already looked at.

Invariants (kept by `reconciliation.services`, the only writer):
- one check per (tenant, saga, step): a step compensated twice (by its agent and again by a
  recovery worker) is checked once;
- a check's verdict is one of `confirmed`, `drift`, `unverifiable` and is never inferred: only
  an observer's answer (reversed true / false) confirms or finds drift; no answer, an unknown
  answer or no observer at all is `unverifiable`;
- `token` grows by one on every claim; only the holder of the current token may report, so a
  worker whose lease lapsed and was re-claimed cannot record a verdict;
- every verdict is a `RECONCILIATION_VERDICT` record in the tenant's server stream, carrying the
  saga id (evidence), written in the same transaction as the verdict.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

from core.scoping import TenantScopedModel


class CheckStatus(models.TextChoices):
    PENDING = "pending", "Waiting for an observer"
    CLAIMED = "claimed", "Being observed"
    CONFIRMED = "confirmed", "Confirmed reversed"
    DRIFT = "drift", "Drift: not reversed"
    UNVERIFIABLE = "unverifiable", "Unverifiable"


OPEN_STATUSES = (CheckStatus.PENDING, CheckStatus.CLAIMED)
VERDICTS = (CheckStatus.CONFIRMED, CheckStatus.DRIFT, CheckStatus.UNVERIFIABLE)


class Reason(models.TextChoices):
    REVERSED = "reversed", "The observer saw the effect reversed"
    NOT_REVERSED = "not_reversed", "The observer saw the effect still standing"
    OBSERVER_UNKNOWN = "observer_unknown", "The observer could not tell"
    OBSERVER_ERROR = "observer_error", "The observer failed"
    NO_OBSERVER = "no_observer", "No observer claimed the check before its deadline"
    OBSERVER_SILENT = "observer_silent", "An observer claimed the check and never answered"
    NO_HANDLER = "no_handler", "The compensation has no handler name an observer could be registered for"


class ReconciliationCheck(TenantScopedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    saga_id = models.CharField(max_length=128)
    step_id = models.CharField(max_length=128)
    tool = models.CharField(max_length=200, blank=True, default="")
    # The compensation's registered name (`sp.undo("shop.refund", ...)`): what observers register for.
    handler = models.CharField(max_length=200, blank=True, default="")
    kwargs = models.JSONField(default=dict)
    idempotency_key = models.CharField(max_length=128, blank=True, default="")
    compensated_leaf = models.BigIntegerField(help_text="leaf index of the COMPENSATED record")
    compensated_in = models.CharField(max_length=200, help_text="stream of the COMPENSATED record")
    status = models.CharField(max_length=16, choices=CheckStatus.choices, default=CheckStatus.PENDING)
    reason = models.CharField(max_length=20, choices=Reason.choices, blank=True, default="")
    detail = models.CharField(max_length=500, blank=True, default="")
    token = models.BigIntegerField(default=0, help_text="fencing token: grows on every claim")
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    observer = models.CharField(max_length=200, blank=True, default="", help_text="who gave the verdict")
    created_at = models.DateTimeField(default=timezone.now)
    not_before = models.DateTimeField(default=timezone.now)
    deadline = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "saga_id", "step_id"], name="one_check_per_step"),
        ]
        indexes = [
            models.Index(fields=["tenant", "status", "not_before"], name="recon_check_open"),
            models.Index(fields=["tenant", "saga_id"], name="recon_check_saga"),
            models.Index(fields=["tenant", "status", "decided_at"], name="recon_check_verdict"),
        ]

    @property
    def decided(self) -> bool:
        return self.status in VERDICTS


class ReconciliationCursor(TenantScopedModel):
    """How far (in leaf indices) the pass has looked for COMPENSATED records: leaves below
    `scanned` have been turned into checks. Committed leaves are always a prefix of the log
    (indices are assigned under the tenant log lock, held to commit), so nothing is skipped."""

    scanned = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant"], name="one_reconciliation_cursor")]
