"""What a transparency-log leaf commits to: one record's place in its stream and its chain hash.

Not the payload: a redacted record keeps its `_h`, so erasure never breaks an inclusion proof.
The server computes this at ingest; an offline verifier recomputes it from the record alone."""

from __future__ import annotations

from sagaplane.chain import canonical


def leaf_data(stream_id: str, position: int, record_hash: str) -> bytes:
    """`position` is the record's 1-based place in its stream's chain (not its `seq`, which a
    reopened agent-saga WAL restarts at 1)."""
    return canonical({"v": 1, "stream": stream_id, "pos": position, "h": record_hash})
