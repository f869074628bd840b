"""The saga projection: saga and step state derived from audit records, in record (leaf) order.

`project_appended` is subscribed to `audit.hooks.on_records_appended` (in `SagasConfig.ready`), so it
runs inside the ingest transaction and a saga's state is never ahead of or behind its stored
records. `rebuild_tenant` / `rebuild_saga` recompute it from
the records alone; a test checks that the two agree.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from sagaplane import credentials
from sagaplane.events import Event

from audit.hooks import AppendedRecords, OnStored
from audit.jsonvalues import index_json, index_text
from core.postcommit import after_commit
from core.scoping import require_tenant
from sagas import queries
from sagas.models import AGENT_NAME_MAX, Saga, SagaStatus, Step, StepStatus
from tenants.models import Tenant

logger = logging.getLogger(__name__)

STEP_EVENTS: dict[str, StepStatus] = {
    Event.STEP_INTENT: StepStatus.INTENT,
    Event.STEP_COMMITTED: StepStatus.COMMITTED,
    Event.COMPLETED_VIA_FALLBACK: StepStatus.COMMITTED,
    Event.STEP_UNKNOWN: StepStatus.UNKNOWN,
    Event.STEP_ORPHANED: StepStatus.ORPHANED,
    Event.COMPENSATED: StepStatus.COMPENSATED,
    Event.COMPENSATION_FAILED: StepStatus.COMPENSATION_FAILED,
}
# A step's later records only move it forward: a re-ordered or repeated intent never un-commits it.
_STEP_RANK = {
    StepStatus.INTENT: 0,
    StepStatus.COMMITTED: 1,
    StepStatus.UNKNOWN: 1,
    StepStatus.ORPHANED: 2,
    StepStatus.COMPENSATED: 2,
    StepStatus.COMPENSATION_FAILED: 2,
}

Item = tuple[Any, dict[str, Any] | None]  # (audit Record, its business fields or None if erased)


# A lease longer than this (about 31 years) is not a lease; the saga is then never reported orphaned.
MAX_LEASE_TTL = 1e9


def _when(ts: float) -> datetime | None:
    try:
        return datetime.fromtimestamp(ts, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _number(value: Any) -> float | None:
    if type(value) not in (int, float):
        return None
    try:
        return float(value)
    except OverflowError:  # a JSON integer of hundreds of digits: no float holds it
        return None


def _set_status(saga: queries.SagaState, status: str) -> None:
    if saga.status == SagaStatus.QUARANTINED:
        return  # a quarantine is lifted by a human (a later issue), never by the agent's own records
    if saga.status == SagaStatus.ROLLBACK_PARTIAL and status == SagaStatus.ROLLED_BACK:
        return  # a partial rollback stays flagged for a human even if the saga then says "aborted"
    saga.status = status


def _apply_one(
    saga: queries.SagaState, record: Any, fields: dict[str, Any] | None, steps: dict[str, queries.StepState]
) -> queries.StepState | None:
    """Fold one record into its saga (and step). Returns the step it touched, if any."""
    biz = fields or {}
    event = record.event
    when = _when(record.ts)
    saga.record_count += 1
    saga.last_event = event
    if when is not None and (saga.last_activity_at is None or when > saga.last_activity_at):
        saga.last_activity_at = when
    if saga.first_leaf_index is None:
        saga.first_leaf_index = record.leaf_index
    saga.last_leaf_index = record.leaf_index
    if saga.started_at is None:
        saga.started_at = when
    touched: queries.StepState | None = None
    if event == Event.SAGA_START:
        # Index copies (audit.jsonvalues): the records keep the exact values.
        saga.name = index_text(str(biz.get("name") or saga.name)[:200])
        agent = biz.get("agent")
        if isinstance(agent, str):
            saga.agent = agent_label(agent) or saga.agent
        ttl = _number(biz.get("lease_ttl"))
        if ttl is not None and 0 < ttl <= MAX_LEASE_TTL:  # not NaN, not Infinity
            saga.lease_ttl = ttl
        _lease(saga, when)
    elif event == Event.SAGA_LEASE:
        _lease(saga, when)
    elif event in STEP_EVENTS and record.step_id:
        touched = steps.get(record.step_id)
        if touched is None:
            touched = queries.StepState(
                saga,
                record.step_id,
                ordinal=len(steps) + 1,
                first_leaf_index=record.leaf_index,
                last_leaf_index=record.leaf_index,
            )
            steps[record.step_id] = touched
        new_status = STEP_EVENTS[event]
        if _STEP_RANK[new_status] >= _STEP_RANK[StepStatus(touched.status)]:
            touched.status = new_status
        touched.tool = record.tool or touched.tool
        semantics = biz.get("semantics")
        if isinstance(semantics, str):
            touched.semantics = index_text(semantics[:20])
        if "compensation" in biz and isinstance(biz["compensation"], dict | None):
            touched.compensation = index_json(biz["compensation"])
        touched.last_leaf_index = record.leaf_index
    elif event == Event.ROLLBACK_END:
        counts = [biz.get(k) for k in ("failed", "orphaned", "unresolved")]
        clean = fields is not None and not any(counts) and not biz.get("halted")
        # An erased ROLLBACK_END cannot prove the rollback clean: a human has to look.
        _set_status(saga, SagaStatus.ROLLED_BACK if clean else SagaStatus.ROLLBACK_PARTIAL)
    elif event == Event.SAGA_ABORTED:
        clean = biz.get("clean") is True or (fields is None and saga.status == SagaStatus.ROLLED_BACK)
        _set_status(saga, SagaStatus.ROLLED_BACK if clean else SagaStatus.ROLLBACK_PARTIAL)
    elif event == Event.SAGA_COMPLETE:
        _set_status(saga, SagaStatus.COMPLETED)
    elif event == Event.SAGA_QUARANTINED:
        saga.status = SagaStatus.QUARANTINED
    elif event in (Event.RECOVERY_STARTED, Event.RECOVERY_ESCALATED):
        _set_status(saga, SagaStatus.RECOVERING)
    return touched


_NOT_SHOWN = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def agent_label(name: str) -> str:
    """An agent's self-given name as the projection keeps it: the record keeps the name exactly;
    this index copy drops what a text column or a page cannot hold (NUL, control characters,
    lone surrogates), trims, and keeps at most AGENT_NAME_MAX characters."""
    return _NOT_SHOWN.sub("", name).strip()[:AGENT_NAME_MAX]


def _lease(saga: queries.SagaState, when: datetime | None) -> None:
    if when is not None and (saga.last_lease_at is None or when > saga.last_lease_at):
        saga.last_lease_at = when
    if saga.last_lease_at is not None and saga.lease_ttl:
        try:
            saga.lease_expires_at = saga.last_lease_at + timedelta(seconds=saga.lease_ttl)
        except OverflowError:  # past year 9999: a lease that never lapses
            saga.lease_expires_at = None


@dataclass
class _Fold:
    """A batch folded into the projection as read, not yet written."""

    items: Sequence[Item]
    saga_ids: list[str]
    sagas: dict[str, queries.SagaState] = field(default_factory=dict)
    before: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    new_sagas: list[queries.SagaState] = field(default_factory=list)
    existing: list[queries.SagaState] = field(default_factory=list)
    steps: list[queries.StepState] = field(default_factory=list)
    snapshot: dict[str, tuple[int | None, int | None]] | None = None

    def changes(self) -> list[dict[str, Any]]:
        return [
            {
                "saga_id": sid,
                "new_records": self.counts[sid],
                "status": self.sagas[sid].status,
                "previous_status": self.before.get(sid),
            }
            for sid in self.saga_ids
        ]


def _fold(tenant: Tenant, items: Sequence[Item]) -> _Fold:
    """Read the touched sagas and steps and fold `items` (in leaf order) into them, in memory."""
    saga_ids = list(dict.fromkeys(rec.saga_id for rec, _ in items if rec.saga_id))
    fold = _Fold(items, saga_ids)
    if not saga_ids:
        return fold
    # Steps are read only for the sagas whose records here are step records (what _apply_one
    # folds into a step); the rest of a saga's records touch only the saga row.
    stepping = {rec.saga_id for rec, _ in items if rec.saga_id and rec.step_id and rec.event in STEP_EVENTS}
    sagas, steps = queries.load(tenant.pk, saga_ids, steps_of=stepping)
    fold.sagas = sagas
    fold.snapshot = {sid: (s.pk, s.last_leaf_index) for sid, s in sagas.items()}
    fold.before = {sid: s.status for sid, s in sagas.items()}
    counts = fold.counts = dict.fromkeys(saga_ids, 0)
    new_sagas = fold.new_sagas
    new_steps: list[queries.StepState] = []
    dirty_steps: dict[int, queries.StepState] = {}
    for record, fields in items:
        if not record.saga_id:
            continue
        saga = sagas.get(record.saga_id)
        if saga is None:
            saga = queries.SagaState(tenant.pk, record.saga_id, record.stream.stream_id)
            sagas[record.saga_id] = saga
            new_sagas.append(saga)
        counts[record.saga_id] += 1
        saga_steps = steps[record.saga_id]
        known = len(saga_steps)
        touched = _apply_one(saga, record, fields, saga_steps)
        if touched is not None:
            if len(saga_steps) > known:  # _apply_one created it
                new_steps.append(touched)
            elif touched.pk is not None:
                dirty_steps[touched.pk] = touched
    created = {id(s) for s in new_sagas}
    fold.existing = [s for s in sagas.values() if id(s) not in created]
    fold.steps = [*new_steps, *dirty_steps.values()]
    return fold


def apply_records(tenant: Tenant, items: Sequence[Item]) -> list[dict[str, Any]]:
    """Fold newly stored records (in leaf order) into the projection. Returns, per saga touched,
    the number of new records and its status before/after (what the live event reports).
    The caller holds the tenant log lock (every projection writer does)."""
    fold = _fold(tenant, items)
    if fold.saga_ids:
        # One upsert on Postgres (sagas then their touched steps); the ORM elsewhere.
        queries.save(tenant.pk, fold.new_sagas, fold.existing, fold.steps)
    return fold.changes()


def prepare_records(tenant: Tenant, items: Sequence[Item]) -> _Fold | None:
    """Ingest, before the tenant log lock: on Postgres, read and fold now, with each record's leaf
    index standing as a marker -(n+1) (the real indices are not known yet), so the locked section
    only checks and writes (`apply_prepared`). Elsewhere nothing happens early."""
    if not queries.guarded_save():
        return None
    for n, (record, _) in enumerate(items):
        record.leaf_index = -(n + 1)
    return _fold(tenant, items)


def apply_prepared(
    tenant: Tenant, fold: _Fold | None, items: Sequence[Item], base: int
) -> list[dict[str, Any]]:
    """Under the tenant log lock, with the records stored at leaf indices base, base+1, ...: write
    the early fold if the sagas it read are unchanged (one guarded statement), else fold again from
    what is stored now (another writer touched one of these sagas in between)."""
    if fold is None:
        return apply_records(tenant, items)
    if not fold.saga_ids:
        return []
    if queries.save(tenant.pk, fold.new_sagas, fold.existing, fold.steps, base=base, snapshot=fold.snapshot):
        return fold.changes()
    logger.info("saga projection changed while a batch was being verified; folding again under the lock")
    return apply_records(tenant, items)


def project_appended(appended: AppendedRecords) -> OnStored:
    """`audit.hooks` subscriber: fold an ingest's records into the projection (read and folded
    before the tenant log lock, written under it), and announce the change after commit."""
    folded = prepare_records(appended.tenant, appended.items)

    def stored(base: int) -> None:
        changes = apply_prepared(appended.tenant, folded, appended.items, base)
        publish_on_commit(appended.tenant, appended.stream_id, len(appended.items), changes)

    return stored


def rebuild_after_erasure(tenant: Tenant, record: Any) -> None:
    """`audit.hooks` subscriber: the projection may hold values from an erased payload (a
    compensation descriptor), so that saga is rebuilt from what its records now say."""
    if record.saga_id:
        rebuild_saga(tenant, record.saga_id)


def _payloads_for(records: Iterable[Any]) -> dict[int, dict[str, Any]]:
    from audit.models import RecordPayload

    ids = [r.pk for r in records]
    return {p.record_id: p.fields for p in RecordPayload.objects.filter(record_id__in=ids)}


def rebuild_saga(tenant: Tenant, saga_id: str) -> None:
    """Recompute one saga from its records (after an erasure changed what they say)."""
    from audit.models import Record

    require_tenant(tenant)
    Saga.objects.filter(saga_id=saga_id).delete()
    records = list(Record.objects.select_related("stream").filter(saga_id=saga_id).order_by("leaf_index"))
    payloads = _payloads_for(records)
    apply_records(tenant, [(r, payloads.get(r.pk)) for r in records])


def rebuild_tenant(tenant: Tenant, *, chunk: int = 2000) -> int:
    """Drop and recompute the tenant's whole projection from its records, in leaf order."""
    from audit.models import Record

    require_tenant(tenant)
    Step.objects.all().delete()
    Saga.objects.all().delete()
    done = 0
    last = -1
    while True:
        records = list(
            Record.objects.select_related("stream")
            .filter(leaf_index__gt=last)
            .exclude(saga_id="")
            .order_by("leaf_index")[:chunk]
        )
        if not records:
            return done
        payloads = _payloads_for(records)
        apply_records(tenant, [(r, payloads.get(r.pk)) for r in records])
        done += len(records)
        last = records[-1].leaf_index


# -- live events -----------------------------------------------------------------------------------


def tenant_group(tenant_id: int) -> str:
    return f"tenant-{tenant_id}"


def publish_on_commit(
    tenant: Tenant, stream_id: str, new_records: int, changes: list[dict[str, Any]]
) -> None:
    """After the ingest commits (never before: a rolled-back batch must not be announced), tell the
    tenant's dashboards what arrived and which sagas changed state."""
    message = {
        "type": "saga.event",
        "stream": stream_id,
        "new_records": new_records,
        "sagas": changes,
        "state_changes": [c for c in changes if c["status"] != c["previous_status"]],
    }
    group = tenant_group(tenant.pk)
    after_commit(f"live event to {group}", lambda: _publish(group, message))


def _publish(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    async_to_sync(layer.group_send)(group, message)


# -- display ---------------------------------------------------------------------------------------

_CREDENTIAL_KEY = re.compile(
    r"(pass(word|wd)?|secret|token|api[_-]?key|apikey|auth(orization)?|credential|private[_-]?key|cookie|session)",
    re.IGNORECASE,
)
_CREDENTIAL_VALUE = re.compile(
    r"^(sk|pk|rk|sp|ghp|gho|xox[abpr])[-_][A-Za-z0-9_\-]{8,}|^eyJ[A-Za-z0-9_\-]{10,}\.|^Bearer\s+\S+|^AKIA[0-9A-Z]{16}$"
)


def credential_reference(value: Any) -> dict[str, str]:
    """Keyed, not a bare hash: a bare SHA-256 of a weak password could be guessed offline."""
    import json

    from django.utils.crypto import salted_hmac

    mac = salted_hmac("sagaplane.credential-reference", json.dumps(value, sort_keys=True, default=str))
    return {"$credential": f"hmac:{mac.hexdigest()[:16]}"}


def _sdk_reference(value: Any) -> bool:
    """The SDK's credential reference (`{"$secret": "<ref>"}`, sagaplane.credentials): the name of a
    credential the agent resolved at call time, never its value, shown as it is."""
    return (
        isinstance(value, dict)
        and len(value) == 1
        and isinstance(ref := value.get(credentials.MARKER), str)
        and credentials.REF_RE.match(ref) is not None
    )


def mask_credentials(value: Any, key: str = "") -> Any:
    """Show anything credential-like only as a reference (a short hash): the dashboard can tell two
    values apart without ever displaying one. The SDK's own references are shown as they are."""
    if _sdk_reference(value):
        return value
    if key and _CREDENTIAL_KEY.search(key) and value not in (None, "", {}, []) and key != "idempotency_key":
        return credential_reference(value)
    if isinstance(value, dict):
        return {k: mask_credentials(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_credentials(v) for v in value]
    if isinstance(value, str) and _CREDENTIAL_VALUE.search(value):
        return credential_reference(value)
    return value
