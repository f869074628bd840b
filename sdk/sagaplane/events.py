"""The record kinds: one vocabulary for every stream of the evidence store.

An agent's WAL (this SDK's or agent-saga's), a recovery worker's results and the control plane's
own server stream are chained the same way, stored as records of the same table, and become
leaves of the same transparency log; a disclosure or an export the SDK verifies carries all of
them, and `sagaplane.approval` reads the server's approval records. So their names are one enum,
here, and the server imports it (docs/DESIGN-NOTES.md, "One record vocabulary").

The enum names what Sagaplane writes or reads. It is not a list of what a stream may hold: a WAL
may carry other kinds (agent-saga writes several of its own), stored and chained as they come.

`Event` is a `str` enum whose values are the names, so on the wire (JSON, the chain's hashes, the
database) nothing changes: `Event.SAGA_START == "SAGA_START"`, and `str()`, f-strings and `%s`
give the name, as `enum.StrEnum` does (3.11+; the SDK also runs on 3.10).
"""

from __future__ import annotations

import enum


class Event(str, enum.Enum):  # noqa: UP042 (StrEnum is 3.11+; the SDK supports 3.10)
    # -- a saga, written by the SDK's engine (and agent-saga's) ---------------------------------
    SAGA_START = "SAGA_START"  # also written with `suspended: true` when a framework pauses it
    SAGA_LEASE = "SAGA_LEASE"  # a running saga's heartbeat
    SAGA_COMPLETE = "SAGA_COMPLETE"
    SAGA_ABORTED = "SAGA_ABORTED"
    SAGA_ABORT_CAUSE = "SAGA_ABORT_CAUSE"
    STEP_INTENT = "STEP_INTENT"
    STEP_COMMITTED = "STEP_COMMITTED"
    COMPLETED_VIA_FALLBACK = "COMPLETED_VIA_FALLBACK"  # agent-saga's: committed through a fallback
    STEP_ATTEMPT = "STEP_ATTEMPT"  # a failed attempt another call follows (a retry, a fallback)
    STEP_FAILED = "STEP_FAILED"
    STEP_UNKNOWN = "STEP_UNKNOWN"
    STEP_REFUSED = "STEP_REFUSED"
    STEP_ORPHANED = "STEP_ORPHANED"
    GATE_ALLOW = "GATE_ALLOW"
    GATE_DENY = "GATE_DENY"
    ROLLBACK_START = "ROLLBACK_START"
    COMPENSATED = "COMPENSATED"  # also the server's, for a recovery worker's result
    COMPENSATION_FAILED = "COMPENSATION_FAILED"
    ROLLBACK_END = "ROLLBACK_END"
    WAL_CHAIN_GAP = "WAL_CHAIN_GAP"  # seqs compaction removed on purpose

    # -- the server stream: approvals (agent-saga's WAL opens a request with APPROVAL_REQUESTED) --
    APPROVAL_REQUESTED = "APPROVAL_REQUESTED"
    APPROVAL_VOTE = "APPROVAL_VOTE"
    APPROVAL_BREAK_GLASS = "APPROVAL_BREAK_GLASS"
    APPROVAL_GRANTED = "APPROVAL_GRANTED"
    APPROVAL_DENIED = "APPROVAL_DENIED"
    APPROVAL_WARNING = "APPROVAL_WARNING"
    APPROVAL_ESCALATED = "APPROVAL_ESCALATED"
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
    APPROVAL_LAPSED = "APPROVAL_LAPSED"
    APPROVAL_CONSUMED = "APPROVAL_CONSUMED"
    APPROVAL_CONFLICT = "APPROVAL_CONFLICT"
    APPROVAL_POLICY_CREATED = "APPROVAL_POLICY_CREATED"
    APPROVAL_POLICY_UPDATED = "APPROVAL_POLICY_UPDATED"
    APPROVAL_POLICY_DELETED = "APPROVAL_POLICY_DELETED"

    # -- the server stream: recovery and reconciliation -----------------------------------------
    RECOVERY_STARTED = "RECOVERY_STARTED"
    RECOVERY_ESCALATED = "RECOVERY_ESCALATED"
    RECOVERY_RETRY = "RECOVERY_RETRY"
    RECOVERY_RESOLVED = "RECOVERY_RESOLVED"
    RECOVERY_ASSIGNED = "RECOVERY_ASSIGNED"
    RECOVERY_CANCELLED = "RECOVERY_CANCELLED"
    RECOVERY_WEBHOOK_SET = "RECOVERY_WEBHOOK_SET"
    RECOVERY_WEBHOOK_DELETED = "RECOVERY_WEBHOOK_DELETED"
    RECONCILIATION_VERDICT = "RECONCILIATION_VERDICT"
    RECONCILIATION_RECHECK = "RECONCILIATION_RECHECK"

    # -- the server stream: the fleet ------------------------------------------------------------
    FLEET_BUDGET_CREATED = "FLEET_BUDGET_CREATED"
    FLEET_BUDGET_UPDATED = "FLEET_BUDGET_UPDATED"
    FLEET_BUDGET_DELETED = "FLEET_BUDGET_DELETED"
    FLEET_RATE_LIMIT_CREATED = "FLEET_RATE_LIMIT_CREATED"
    FLEET_RATE_LIMIT_UPDATED = "FLEET_RATE_LIMIT_UPDATED"
    FLEET_RATE_LIMIT_DELETED = "FLEET_RATE_LIMIT_DELETED"
    FLEET_BREAKER_CREATED = "FLEET_BREAKER_CREATED"
    FLEET_BREAKER_UPDATED = "FLEET_BREAKER_UPDATED"
    FLEET_BREAKER_DELETED = "FLEET_BREAKER_DELETED"
    FLEET_BREAKER_TRANSITION = "FLEET_BREAKER_TRANSITION"
    FLEET_SETTINGS_UPDATED = "FLEET_SETTINGS_UPDATED"
    KILLSWITCH_ENGAGED = "KILLSWITCH_ENGAGED"
    KILLSWITCH_RELEASED = "KILLSWITCH_RELEASED"
    SAGA_QUARANTINED = "SAGA_QUARANTINED"

    # -- the server stream: evidence --------------------------------------------------------------
    SAGA_SEALED = "SAGA_SEALED"  # a finished saga's seal (sagaplane.disclosure verifies it)
    AUDIT_RECORD_REDACTED = "AUDIT_RECORD_REDACTED"
    AUDIT_EXPORT_REQUESTED = "AUDIT_EXPORT_REQUESTED"
    AUDIT_EXPORT_DOWNLOADED = "AUDIT_EXPORT_DOWNLOADED"
    AUDIT_CERTIFICATE_ISSUED = "AUDIT_CERTIFICATE_ISSUED"

    # -- the server stream: administration ------------------------------------------------------
    ADMIN_TENANT_CREATED = "ADMIN_TENANT_CREATED"
    ADMIN_MEMBER_ADDED = "ADMIN_MEMBER_ADDED"
    ADMIN_MEMBER_ROLE_CHANGED = "ADMIN_MEMBER_ROLE_CHANGED"
    ADMIN_MEMBER_REMOVED = "ADMIN_MEMBER_REMOVED"
    ADMIN_API_KEY_CREATED = "ADMIN_API_KEY_CREATED"
    ADMIN_API_KEY_REVOKED = "ADMIN_API_KEY_REVOKED"
    ADMIN_PASSKEY_REGISTERED = "ADMIN_PASSKEY_REGISTERED"
    ADMIN_PASSKEY_RENAMED = "ADMIN_PASSKEY_RENAMED"
    ADMIN_PASSKEY_REVOKED = "ADMIN_PASSKEY_REVOKED"
    ADMIN_SIGNING_KEY_ROTATED = "ADMIN_SIGNING_KEY_ROTATED"
    ADMIN_SIGNING_KEY_ROTATION_FINISHED = "ADMIN_SIGNING_KEY_ROTATION_FINISHED"
    ADMIN_WITNESS_ADDED = "ADMIN_WITNESS_ADDED"
    ADMIN_WITNESS_REMOVED = "ADMIN_WITNESS_REMOVED"
    ADMIN_WITNESS_QUORUM_SET = "ADMIN_WITNESS_QUORUM_SET"
    SLACK_INSTALLED = "SLACK_INSTALLED"
    SLACK_UNINSTALLED = "SLACK_UNINSTALLED"
    SLACK_CHANNEL_CHANGED = "SLACK_CHANNEL_CHANGED"
    SLACK_EMAIL_MATCHING_CHANGED = "SLACK_EMAIL_MATCHING_CHANGED"
    SLACK_USER_LINKED = "SLACK_USER_LINKED"
    SLACK_USER_UNLINKED = "SLACK_USER_UNLINKED"

    def __str__(self) -> str:
        return self.value


# What a step's records say about it, in two kinds: its forward outcome (the effect ran, may have,
# or is intended) and what undoing it came to. The projection (sagas) and the saga page read these.
STEP_FORWARD = frozenset(
    {Event.STEP_INTENT, Event.STEP_COMMITTED, Event.COMPLETED_VIA_FALLBACK, Event.STEP_UNKNOWN}
)
STEP_BACKWARD = frozenset({Event.COMPENSATED, Event.COMPENSATION_FAILED, Event.STEP_ORPHANED})
