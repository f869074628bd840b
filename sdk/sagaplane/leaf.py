"""What a transparency-log leaf commits to: one record's place in its stream and its chain hash.

Not the payload: a redacted record keeps its `_h`, so erasure never breaks an inclusion proof.
The server computes this at ingest; an offline verifier recomputes it from the record alone."""

from __future__ import annotations

import json

from sagaplane.chain import canonical

_encode_str = json.encoder.encode_basestring  # json.dumps(ensure_ascii=False)'s string form


def leaf_data(stream_id: str, position: int, record_hash: str) -> bytes:
    """`position` is the record's 1-based place in its stream's chain (not its `seq`, which a
    reopened agent-saga WAL restarts at 1)."""
    if type(stream_id) is str and type(position) is int and type(record_hash) is str:
        # canonical() of the dict below, built directly: keys sorted, compact, int by repr.
        h, stream = _encode_str(record_hash), _encode_str(stream_id)
        return f'{{"h":{h},"pos":{position!r},"stream":{stream},"v":1}}'.encode()
    return canonical({"v": 1, "stream": stream_id, "pos": position, "h": record_hash})
