"""The tool policy file's `reserve` and `settle`: the estimate a template reads from the call's
arguments is sent to the gate as `reserve`, and the actual a template reads from the result rides
the step's record in the WAL (`settle`); a result without it leaves the reservation to the saga's
end; a malformed `reserve` or `settle` is refused at load."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from sagaplane.gate import Call
from sagaplane.integrations import core, policy
from sagaplane.saga import set_default_gate
from sagaplane_testkit import read_wal

RULES = """\
    name = "llm"
    [tools.complete]
    semantics = "COMPENSABLE"
    compensate = { tool = "forget", arguments = { id = "{result.id}" } }
    reserve = "{args.max_tokens}"
    settle = "{result.usage.total}"
    """


class ReservingGate:
    def __init__(self) -> None:
        self.calls: list[Call] = []

    def check(self, call: Call) -> dict[str, Any] | None:
        self.calls.append(call)
        reservation = {"id": "res-1", "state": "open", "reserved": call.reserve}
        return {"decision": "allow", "authorization_id": "res-1", "reservation": reservation}


@pytest.fixture
def gate() -> Iterator[ReservingGate]:
    fake = ReservingGate()
    set_default_gate(fake)  # type: ignore[arg-type]
    yield fake
    set_default_gate(None)


def test_the_estimate_is_reserved_and_the_result_settles_it(tmp_path: Path, gate: ReservingGate) -> None:
    rules = policy.loads(textwrap.dedent(RULES))

    async def forget(tool: str, arguments: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        return {}

    core.register_compensators(rules, forget)
    governor = core.Governor(rules, capture=forget)
    wal = sp.WAL(tmp_path / "r.wal")
    results = [{"id": "a", "usage": {"total": 12}}, {"id": "b"}, {"id": "c", "usage": {"total": -1}}]

    async def run() -> None:
        async with sp.saga(name="llm", wal=wal) as saga:
            for result in results:
                await governor.call(saga, "complete", {"prompt": "hi", "max_tokens": 50}, lambda r=result: r)

    asyncio.run(run())
    wal.close()
    assert [c.reserve for c in gate.calls] == ["50", "50", "50"]
    committed = [r for r in read_wal(wal.path) if r["event"] == "STEP_COMMITTED"]
    # The second result names no usage, the third no amount: both left to the saga's end.
    assert [r.get("settle") for r in committed] == [{"reservation_id": "res-1", "actual": "12"}, None, None]
    allows = [r for r in read_wal(wal.path) if r["event"] == "GATE_ALLOW"]
    assert allows[0]["reservation"]["reserved"] == "50"


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ('settle = "{result.usage.total}"', "settles what `reserve` reserved"),
        ("reserve = 5", "a template"),
        ('reserve = "{result.tokens}"', "{result.…} is not available here"),
        ('reserve = "{args.n}"\nsettle = "{args.n}"', "{args.…} is not available here"),
    ],
)
def test_a_malformed_reserve_or_settle_is_refused_at_load(lines: str, said: str) -> None:
    text = f'name = "llm"\n[tools.complete]\nsemantics = "PREVIEW"\n{lines}\n'
    with pytest.raises(policy.PolicyError) as refused:
        policy.loads(text)
    assert said in str(refused.value)
