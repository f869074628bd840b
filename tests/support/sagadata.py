"""Chained records for a saga that runs two steps, fails the third, and rolls back (LIFO),
made with the SDK's own `chain.stamp`, so they verify at ingest like an agent's WAL."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sagaplane.chain import GENESIS, stamp

TOOLS = ["charge_card", "reserve_stock", "send_invoice"]


class Writer:
    """One stream's chain: seq from 1, each record linked to the previous hash."""

    def __init__(self) -> None:
        self.seq = 0
        self.head = GENESIS

    def record(self, event: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        record = {"seq": self.seq, "ts": round(time.time(), 6), "event": event, **fields}
        self.head = stamp(record, self.head)
        return record


def saga_forward(
    writer: Writer,
    saga_id: str | None = None,
    name: str = "checkout",
    agent: str = "",
    *,
    handlers: str = "shop",
) -> tuple[str, list[dict]]:
    """SAGA_START (with the agent's name, when given) and two committed compensable steps: the
    saga is running. Their compensations name `<handlers>.undo_<tool>`: a test that claims recovery
    work in a shared tenant names its own, so it never takes another saga's (an abandoned one's)."""
    saga_id = saga_id or f"saga-{uuid.uuid4().hex[:12]}"
    named = {"agent": agent} if agent else {}
    out = [writer.record("SAGA_START", saga_id=saga_id, name=name, lease_ttl=300, pid=4242, **named)]
    for n, tool in enumerate(TOOLS[:2], start=1):
        step_id = f"{saga_id}-s{n}"
        kwargs = {"order": "A-17", "amount": 42 * n, "api_key": "sk_live_abcdefghijklmnop"}
        out.append(
            writer.record(
                "STEP_INTENT",
                saga_id=saga_id,
                step_id=step_id,
                tool=tool,
                semantics="COMPENSABLE",
                kwargs=kwargs,
            )
        )
        out.append(
            writer.record(
                "STEP_COMMITTED",
                saga_id=saga_id,
                step_id=step_id,
                tool=tool,
                semantics="COMPENSABLE",
                compensation={
                    "fn": f"undo_{tool}",
                    "handler": f"{handlers}.undo_{tool}",
                    "recoverable": True,
                    "description": f"undo {tool}",
                    "idempotency_key": f"{step_id}:undo",
                    "kwargs": {"order": "A-17"},
                },
            )
        )
    return saga_id, out


def saga_rollback(writer: Writer, saga_id: str, *, fail_last: bool = False) -> list[dict]:
    """The third step fails; steps 2 then 1 are compensated (step 1's may fail)."""
    step3 = f"{saga_id}-s3"
    out = [
        writer.record(
            "STEP_INTENT",
            saga_id=saga_id,
            step_id=step3,
            tool=TOOLS[2],
            semantics="IRREVERSIBLE",
            kwargs={"order": "A-17"},
        ),
        writer.record("SAGA_ABORT_CAUSE", saga_id=saga_id, error="RuntimeError('mail server down')"),
        writer.record("ROLLBACK_START", saga_id=saga_id, steps=2),
        writer.record("COMPENSATED", saga_id=saga_id, step_id=f"{saga_id}-s2", tool=TOOLS[1]),
    ]
    if fail_last:
        out.append(
            writer.record(
                "COMPENSATION_FAILED",
                saga_id=saga_id,
                step_id=f"{saga_id}-s1",
                tool=TOOLS[0],
                error="refund refused",
            )
        )
    else:
        out.append(writer.record("COMPENSATED", saga_id=saga_id, step_id=f"{saga_id}-s1", tool=TOOLS[0]))
    failed = 1 if fail_last else 0
    out.append(
        writer.record(
            "ROLLBACK_END",
            saga_id=saga_id,
            clean=not fail_last,
            compensated=2 - failed,
            failed=failed,
            orphaned=0,
            unresolved=0,
            halted=False,
        )
    )
    out.append(writer.record("SAGA_ABORTED", saga_id=saga_id, clean=not fail_last))
    return out
