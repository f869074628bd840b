"""Recovery's public surface: the actions other apps, the API, the pages and Celery call. The
actions themselves live in `recovery.actions` (one module per concern; its docstring tells the
model); this module only re-exports them, so callers have one stable place to import from."""

from __future__ import annotations

from fleet.services import QuarantineCreate
from recovery.actions.claims import claim, claim_many, heartbeat
from recovery.actions.common import MAX_ATTEMPTS, SYSTEM_ACTOR
from recovery.actions.decisions import assign, assignees, quarantine, resolve, retry, rollback_to
from recovery.actions.leases import watch_appended
from recovery.actions.results import complete, fail, report_many
from recovery.actions.takeover import (
    EVIDENCE_STALE_S,
    SWEEP_BATCH,
    TAKEOVER_BATCH,
    escalate_due,
    take_over_batch,
    take_over_on_claim,
    unclaimed_after,
)
from recovery.actions.webhooks import (
    delete_webhook,
    due_deliveries,
    enqueue_delivery,
    set_webhook,
    webhook_secret,
)
from recovery.inputs import (
    AssignJob,
    Assignment,
    ClaimTerms,
    CompleteJob,
    Completion,
    FailJob,
    Failure,
    HeartbeatJob,
    JobResult,
    LeaseExtension,
    NewWebhook,
    RecoveryClaim,
    RecoveryResults,
    Resolution,
    ResolveJob,
    Results,
    RollbackSaga,
    RollbackTo,
    WebhookSet,
)

__all__ = [
    "EVIDENCE_STALE_S",
    "MAX_ATTEMPTS",
    "SWEEP_BATCH",
    "SYSTEM_ACTOR",
    "TAKEOVER_BATCH",
    "AssignJob",
    "Assignment",
    "ClaimTerms",
    "CompleteJob",
    "Completion",
    "FailJob",
    "Failure",
    "HeartbeatJob",
    "JobResult",
    "LeaseExtension",
    "NewWebhook",
    "QuarantineCreate",
    "RecoveryClaim",
    "RecoveryResults",
    "Resolution",
    "ResolveJob",
    "Results",
    "RollbackSaga",
    "RollbackTo",
    "WebhookSet",
    "assign",
    "assignees",
    "claim",
    "claim_many",
    "complete",
    "delete_webhook",
    "due_deliveries",
    "enqueue_delivery",
    "escalate_due",
    "fail",
    "heartbeat",
    "quarantine",
    "report_many",
    "resolve",
    "retry",
    "rollback_to",
    "set_webhook",
    "take_over_batch",
    "take_over_on_claim",
    "unclaimed_after",
    "watch_appended",
    "webhook_secret",
]
