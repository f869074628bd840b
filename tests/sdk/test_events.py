"""The record vocabulary (`sagaplane.events.Event`): values are the names, unchanged on the wire."""

from __future__ import annotations

import json
from typing import Any

import sagaplane as sp
from sagaplane.chain import canonical, record_hash, verify_chain
from sagaplane.events import STEP_BACKWARD, STEP_FORWARD, Event
from sagaplane_testkit import read_wal


def test_every_member_is_its_own_name_as_a_plain_string_would_be() -> None:
    for member in Event:
        assert member.value == member.name
        assert member == member.name and hash(member) == hash(member.name)
        assert str(member) == f"{member}" == "%s" % member == member.name  # noqa: UP031 (logging)
        assert type(str(member)) is str
        assert json.dumps({"event": member}) == json.dumps({"event": member.name})
        assert canonical(member) == canonical(member.name)
        assert record_hash("0" * 64, 1, 1.5, member, "d") == record_hash("0" * 64, 1, 1.5, member.name, "d")


def test_a_step_record_is_either_a_forward_outcome_or_an_undoing() -> None:
    assert not STEP_FORWARD & STEP_BACKWARD
    assert Event.STEP_COMMITTED in STEP_FORWARD and "COMPENSATED" in STEP_BACKWARD


def test_a_saga_written_with_the_enum_reads_back_as_plain_names(tmp_path: Any) -> None:
    wal = sp.WAL(tmp_path / "agent.wal")
    ok = sp.tool(lambda: 1, semantics=sp.COMPENSABLE, compensate=lambda r: lambda: None, name="t.ok")
    try:
        with sp.saga(name="enum", wal=wal):
            ok()
            raise RuntimeError("undo")
    except sp.SagaAborted:
        pass
    wal.close()
    records = read_wal(tmp_path / "agent.wal")
    assert [r["event"] for r in records] == [
        "SAGA_START",
        "STEP_INTENT",
        "STEP_COMMITTED",
        "SAGA_ABORT_CAUSE",
        "ROLLBACK_START",
        "COMPENSATED",
        "ROLLBACK_END",
        "SAGA_ABORTED",
    ]
    assert all(type(r["event"]) is str for r in records)
    assert verify_chain(records).intact
