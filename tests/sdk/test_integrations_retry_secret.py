"""The tool policy file's `retry`, `fallback` and `secret` keys: validated at load (file:line), and a
governed call retried inside one step, completed through its fallback (another tool of the source,
through the integration's tool-calling callable), and given resolved credentials while the WAL
holds references."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from sagaplane import credentials
from sagaplane.integrations import core, policy
from sagaplane.integrations.policy import PolicyError
from sagaplane_testkit import read_wal

VALUE = "sk_live_policy_0c4f2a9e71b3"

TEXT = textwrap.dedent(
    """\
    name = "retry-shop"
    [tools.charge]
    semantics = "COMPENSABLE"
    on_error = "not_applied"
    compensate = { tool = "refund", arguments = { charge_id = "{result.id}", api_key = "{args.api_key}" } }
    retry = { max_attempts = 3, backoff = "linear", base_s = 0, jitter = false, retry_on = ["ToolFailed"] }
    fallback = { tool = "charge_backup", arguments = { total = "{args.amount}", api_key = "{args.api_key}" } }
    secret = ["api_key"]
    [tools.charge_backup]
    semantics = "COMPENSABLE"
    compensate = { tool = "refund", arguments = { charge_id = "{result.id}" } }
    secret = ["api_key"]
    [tools.refund]
    semantics = "IRREVERSIBLE"
    """
)
POLICY = policy.loads(TEXT, "retry.toml")


def test_the_keys_are_read() -> None:
    rule = POLICY.rule_for("charge")
    assert rule is not None and rule.retry is not None and rule.fallback is not None
    assert rule.retry == sp.Retry(
        max_attempts=3, backoff="linear", base_s=0, jitter=False, retry_on=("ToolFailed",)
    )
    assert rule.fallback.tool == "charge_backup" and not rule.fallback_same_arguments
    assert rule.secret == ("api_key",)


BASE = 'name = "p"\n[tools.t]\nsemantics = "PREVIEW"\n'


@pytest.mark.parametrize(
    ("extra", "line", "words"),
    [
        ("retry = 3\n", 4, "retry: a table"),
        ("retry = { attempts = 3 }\n", 4, "unknown key 'attempts'"),
        ("retry = { max_attempts = 0 }\n", 4, "max_attempts: an integer from 1 to 100"),
        ("retry = { max_attempts = 2.5 }\n", 4, "max_attempts"),
        ('retry = { backoff = "fibonacci" }\n', 4, "backoff: one of"),
        ("retry = { cap_s = -1 }\n", 4, "cap_s: seconds"),
        ('retry = { jitter = "yes" }\n', 4, "jitter: true or false"),
        ('retry = { retry_on = "TimeoutError" }\n', 4, "retry_on: a list of exception class names"),
        ('retry = { no_retry_on = ["not a name"] }\n', 4, "no_retry_on"),
        ('fallback = { tool = "t" }\n', 4, "another tool than 't'"),
        ('fallback = { tool = "elsewhere" }\n', 4, "'elsewhere' is not a tool this policy allows"),
        (
            'fallback = { tool = "u", arguments = { x = "{result.id}" } }\n'
            '[tools.u]\nsemantics = "PREVIEW"\n',
            4,
            "{result.…} is not available",
        ),
        ('secret = "api_key"\n', 4, "secret: a list of argument names"),
        ('secret = ["a", "a"]\n', 4, "secret: a list"),
    ],
)
def test_mistakes_in_the_new_keys_are_refused_with_the_file_and_line(
    extra: str, line: int, words: str
) -> None:
    with pytest.raises(PolicyError) as refused:
        policy.loads(BASE + extra, "tools.toml")
    assert refused.value.line == line and words in str(refused.value), str(refused.value)
    assert str(refused.value).startswith(f"tools.toml:{line}: ")


@pytest.fixture
def vault() -> Iterator[None]:
    credentials.set_resolver({"stripe": VALUE}.get)
    yield
    credentials.set_resolver(None)


@pytest.mark.usefixtures("vault")
def test_a_governed_call_retries_falls_back_and_gets_the_credential(tmp_path: Path) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    async def run_tool(tool: str, arguments: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        sent.append((tool, arguments))
        return {"id": "bk_1"}

    core.register_compensators(POLICY, run_tool)
    governor = core.Governor(POLICY, is_error=lambda r: r.get("error") is True, capture=run_tool)

    async def perform(resolved: dict[str, Any]) -> dict[str, Any]:
        sent.append(("charge", resolved))
        return {"error": True}  # the tool says it failed, and the policy says: nothing happened

    async def run() -> Any:
        with sp.WAL(tmp_path / "a.wal", fsync=False) as wal:
            async with sp.saga(name="p", wal=wal) as saga:
                return await governor.call(saga, "charge", {"amount": 9, "api_key": "stripe"}, perform)

    assert asyncio.run(run()) == {"id": "bk_1"}
    assert sent == [("charge", {"amount": 9, "api_key": VALUE})] * 3 + [
        ("charge_backup", {"total": 9, "api_key": VALUE})
    ]
    records = read_wal(tmp_path / "a.wal")
    assert [r["attempt"] for r in records if r["event"] == "STEP_ATTEMPT"] == [1, 2, 3]
    done = next(r for r in records if r["event"] == "COMPLETED_VIA_FALLBACK")
    assert done["fallback"] == "charge_backup" and done["compensation"]["handler"] == "retry-shop:refund"
    intent = next(r for r in records if r["event"] == "STEP_INTENT")
    assert intent["kwargs"] == {"amount": 9, "api_key": {"$secret": "stripe"}}
    wal_bytes = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert VALUE.encode() not in wal_bytes and b'"$secret":"stripe"' in wal_bytes


@pytest.mark.usefixtures("vault")
def test_a_secret_argument_that_names_no_reference_is_refused(tmp_path: Path) -> None:
    governor = core.Governor(POLICY, capture=lambda tool, arguments: {})
    with (
        sp.WAL(tmp_path / "a.wal", fsync=False) as wal,
        sp.saga(name="p", wal=wal) as saga,
        pytest.raises(core.Refused) as refused,
    ):
        governor.call_sync(saga, "charge", {"amount": 1, "api_key": "not a name"}, lambda r: {"id": 1})
    assert refused.value.reason == "invalid_secret"


class RecordingGate:
    def __init__(self) -> None:
        self.args: list[dict[str, Any]] = []

    def check(self, call: Any) -> dict[str, Any]:
        self.args.append(call.args)
        return {"decision": "allow", "authorization_id": "az"}


@pytest.mark.usefixtures("vault")
def test_the_preflight_asks_the_gate_about_the_same_arguments_as_the_call(tmp_path: Path) -> None:
    from sagaplane.saga import set_default_gate

    gate = RecordingGate()
    set_default_gate(gate)  # type: ignore[arg-type]
    governor = core.Governor(POLICY, capture=lambda tool, arguments: {"id": 1})
    arguments = {"amount": 1, "api_key": "stripe"}
    try:

        async def run() -> None:
            with sp.WAL(tmp_path / "a.wal", fsync=False) as wal:
                async with sp.saga(name="p", wal=wal) as saga:
                    assert await governor.preflight(saga, "charge", arguments, step_id="s1") is None
                    await governor.call(saga, "charge", arguments, lambda resolved: {"id": 1}, step_id="s1")

        asyncio.run(run())
    finally:
        set_default_gate(None)
    assert gate.args == [{"amount": 1, "api_key": {"$secret": "stripe"}}] * 2
