"""Chains for tests: agent-saga-format records (the SDK's `stamp` is byte-compatible with
agent-saga), a Writer shipping an agent's stream through the real ingest, the server stream as
stored, and a saga whose steps its own rollback compensated (what reconciliation checks)."""

from __future__ import annotations

import copy
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sagaplane.chain import GENESIS, stamp

from audit import services as audit_services
from audit.models import Record, RecordPayload, Stream
from core.scoping import tenant_context
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.scoping import in_tenant

T0 = 1_796_000_000.0


def saga_records(
    saga_id: str | None = None,
    *,
    tool: str = "payments.charge",
    steps: int = 1,
    outcome: str = "complete",
    name: str = "demo",
    step_ids: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Unchained records of one saga, as agent-saga writes them (step ids random unless given)."""
    saga_id = saga_id or uuid.uuid4().hex
    out: list[dict[str, Any]] = [
        {"event": "SAGA_START", "saga_id": saga_id, "pid": 42, "lease_ttl": 5.0, "name": name}
    ]
    given_step_ids = list(step_ids or [])
    step_ids = []
    for n in range(steps):
        step_id = given_step_ids[n] if n < len(given_step_ids) else uuid.uuid4().hex
        step_ids.append(step_id)
        out.append(
            {
                "event": "STEP_INTENT",
                "saga_id": saga_id,
                "step_id": step_id,
                "tool": tool,
                "semantics": "COMPENSABLE",
                "kwargs": {"amount": 10 + n},
            }
        )
        out.append(
            {
                "event": "STEP_COMMITTED",
                "saga_id": saga_id,
                "step_id": step_id,
                "tool": tool,
                "semantics": "COMPENSABLE",
                "compensation": {
                    "fn": "refund",
                    "handler": "demo.refund",
                    "recoverable": True,
                    "description": "refund",
                    "idempotency_key": uuid.uuid4().hex,
                    "kwargs": {"charge_id": f"ch_{n}", "api_key": "sk_live_abcdefghijkl"},
                },
            }
        )
    if outcome == "complete":
        out.append({"event": "SAGA_COMPLETE", "saga_id": saga_id, "clean": True})
    elif outcome == "rolled_back":
        out.append({"event": "ROLLBACK_START", "saga_id": saga_id, "steps": steps})
        for step_id in reversed(step_ids):
            out.append(
                {
                    "event": "COMPENSATED",
                    "saga_id": saga_id,
                    "step_id": step_id,
                    "tool": tool,
                    "idempotency_key": "k",
                }
            )
        out.append(
            {
                "event": "ROLLBACK_END",
                "saga_id": saga_id,
                "clean": True,
                "compensated": steps,
                "failed": 0,
                "orphaned": 0,
                "unresolved": 0,
                "halted": False,
            }
        )
        out.append({"event": "SAGA_ABORTED", "saga_id": saga_id, "clean": True})
    elif outcome == "partial":
        out.append({"event": "ROLLBACK_START", "saga_id": saga_id, "steps": steps})
        if step_ids:
            out.append(
                {
                    "event": "COMPENSATION_FAILED",
                    "saga_id": saga_id,
                    "step_id": step_ids[-1],
                    "tool": tool,
                    "error": "boom",
                    "attempts": 3,
                    "idempotency_key": "k",
                }
            )
        out.append(
            {
                "event": "ROLLBACK_END",
                "saga_id": saga_id,
                "clean": False,
                "compensated": 0,
                "failed": 1,
                "orphaned": 0,
                "unresolved": 0,
                "halted": False,
            }
        )
        out.append({"event": "SAGA_ABORTED", "saga_id": saga_id, "clean": False})
    return out


def chain(
    bodies: list[dict[str, Any]], *, prev: str = GENESIS, seq: int = 1, ts: float = T0
) -> list[dict[str, Any]]:
    """Chain record bodies onto `prev`, numbering seqs from `seq`, key order as agent-saga writes."""
    out = []
    for n, body in enumerate(bodies):
        record = {
            "seq": seq + n,
            "event": body["event"],
            "ts": ts + (seq + n) / 1000.0,
            **{k: v for k, v in body.items() if k != "event"},
        }
        prev = stamp(record, prev)
        out.append(record)
    return out


def restamp(records: list[dict[str, Any]], start: int, prev: str) -> list[dict[str, Any]]:
    """Re-chain records[start:] onto `prev` (what a forger with write access would do)."""
    out = copy.deepcopy(records)
    for record in out[start:]:
        for key in ("_s", "_cd", "_ph", "_h"):
            record.pop(key, None)
        prev = stamp(record, prev)
    return out


def snapshot(tenant: Tenant) -> tuple:
    """Everything a refused batch must leave unchanged."""
    with tenant_context(tenant):
        return (
            list(
                Record.objects.order_by("pk").values_list("stream__stream_id", "position", "h", "leaf_index")
            ),
            list(Stream.objects.order_by("pk").values_list("stream_id", "head_hash", "head_seq", "length")),
            RecordPayload.objects.count(),
        )


@dataclass(frozen=True)
class Sample:
    """A tenant's own stream, saga, saga name and step ids: different for every tenant, so each is
    a leak marker (a tenant's id showing up in another tenant's answer can only be a leak)."""

    stream_id: str
    saga_id: str
    saga_name: str
    step_ids: tuple[str, ...]

    @property
    def markers(self) -> list[str]:
        return [self.stream_id, self.saga_id, self.saga_name, *self.step_ids]


def sample_of(tenant: Tenant) -> Sample:
    """The tenant's sample ids, derived from its slug (unique among the tenants of a test)."""

    def derived(what: str) -> str:
        return uuid.uuid5(uuid.NAMESPACE_URL, f"sagaplane-test:{tenant.slug}:{what}").hex

    return Sample(
        stream_id=f"st-{derived('stream')[:16]}",
        saga_id=derived("saga"),
        saga_name=f"saga-{derived('name')[:12]}",
        step_ids=(derived("step-1"), derived("step-2")),
    )


def ensure_sample(tenant: Tenant) -> Sample:
    """The tenant's sample stream holding its sample saga, ingested once (isolation tests)."""
    from audit.services import ingest

    sample = sample_of(tenant)
    with tenant_context(tenant):
        if Stream.objects.filter(stream_id=sample.stream_id).exists():
            return sample
    records = saga_records(sample.saga_id, steps=2, name=sample.saga_name, step_ids=list(sample.step_ids))
    in_tenant(ingest, tenant, sample.stream_id, chain(records), actor=named_actor("test"))
    return sample


def sample_stream_id(tenant: Tenant, _person: Any) -> str:
    return ensure_sample(tenant).stream_id


def sample_saga_id(tenant: Tenant, _person: Any) -> str:
    return ensure_sample(tenant).saga_id


@dataclass
class Writer:
    """One agent's stream: appends chained records and ships them through ingest."""

    tenant: Tenant
    stream_id: str
    head: str = GENESIS
    seq: int = 0
    shipped: list[dict[str, Any]] = field(default_factory=list)

    def records(self, *items: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for event, fields in items:
            self.seq += 1
            record = {"seq": self.seq, "ts": round(time.time(), 6), "event": event, **fields}
            self.head = stamp(record, self.head)
            out.append(record)
        return out

    def ship(self, *items: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
        batch = self.records(*items)
        in_tenant(audit_services.ingest, self.tenant, self.stream_id, batch, actor=named_actor("test"))
        self.shipped.extend(batch)
        return batch

    def saga(
        self, saga_id: str, *, steps: int = 2, end: str | None = "SAGA_COMPLETE"
    ) -> list[dict[str, Any]]:
        items: list[tuple[str, dict[str, Any]]] = [("SAGA_START", {"saga_id": saga_id, "name": saga_id})]
        for n in range(steps):
            step = {
                "saga_id": saga_id,
                "step_id": f"{saga_id}-s{n}",
                "tool": "payments.charge",
                "kwargs": {"amount": 10 + n},
            }
            items += [("STEP_INTENT", step), ("STEP_COMMITTED", step)]
        if end:
            items.append((end, {"saga_id": saga_id}))
        return self.ship(*items)


def server_stream(tenant: Tenant, *, flush: bool = True) -> list[dict[str, Any]]:
    """The tenant's server stream (admin actions, approvals, seals) as stored, oldest first; with
    `flush`, once the records still pending (recovery results, chained in batches) are chained,
    as the recovery sweep chains them within a second."""
    from audit.models import Record, RecordPayload, Redaction
    from audit.services import chain_pending_server_records, stored_record
    from core.scoping import tenant_context

    if flush:
        chain_pending_server_records(tenant, wait=True)
    with tenant_context(tenant):
        rows = list(Record.objects.filter(stream__stream_id="server").order_by("position"))
        payloads = {p.record_id: p for p in RecordPayload.objects.filter(record__in=rows)}
        erased = dict(Redaction.objects.values_list("record_id", "reason"))
        return [stored_record(r, payloads.get(r.pk), erased.get(r.pk)) for r in rows]


def compensated_saga(
    writer: Writer,
    saga_id: str,
    *,
    charges: list[str] | None = None,
    handler: str | None = "shop.refund",
    failed: bool = False,
) -> list[str]:
    """A checkout whose charges were refunded by its own rollback (the SDK's COMPENSATED records);
    with `failed`, the last refund failed instead. Returns the step ids, in order."""
    charges = charges or ["ch_1"]
    items: list[tuple[str, dict[str, Any]]] = [("SAGA_START", {"saga_id": saga_id, "name": "checkout"})]
    steps = []
    for n, charge in enumerate(charges):
        step_id = f"{saga_id}-s{n}"
        steps.append(step_id)
        base = {"saga_id": saga_id, "step_id": step_id, "tool": "shop.charge"}
        compensation = None
        if handler is not None:
            compensation = {
                "fn": "refund",
                "handler": handler,
                "recoverable": True,
                "description": "",
                "idempotency_key": f"idem-{step_id}",
                "kwargs": {"charge_id": charge},
            }
        items.append(("STEP_INTENT", {**base, "semantics": "COMPENSABLE", "kwargs": {"amount": 42}}))
        items.append(("STEP_COMMITTED", {**base, "semantics": "COMPENSABLE", "compensation": compensation}))
    items.append(("ROLLBACK_START", {"saga_id": saga_id, "steps": len(charges)}))
    for n, step_id in enumerate(reversed(steps)):
        done: dict[str, Any] = {"saga_id": saga_id, "step_id": step_id, "tool": "shop.charge", "attempts": 1}
        if failed and n == 0:
            items.append(("COMPENSATION_FAILED", {**done, "error": "RuntimeError('card network down')"}))
        else:
            items.append(("COMPENSATED", {**done, "idempotency_key": f"idem-{step_id}"}))
    clean = not failed
    items.append(
        (
            "ROLLBACK_END",
            {
                "saga_id": saga_id,
                "clean": clean,
                "compensated": len(charges) - failed,
                "failed": int(failed),
                "orphaned": 0,
                "unresolved": 0,
                "halted": failed,
            },
        )
    )
    items.append(("SAGA_ABORTED", {"saga_id": saga_id, "clean": clean}))
    writer.ship(*items)
    return steps
