"""The MCP gateway with broken or hostile peers, and observe mode, without a control plane (a
local WAL only): an upstream that never answers, one that dies mid-call and one that answers too
much leave the step unknown and the client with an error result, never a hang; JSON-RPC garbage
from the client is answered and the session goes on; observe mode forwards everything and writes
a policy skeleton in which every tool is IRREVERSIBLE."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession
from sagaplane.integrations import policy
from sagaplane.integrations.mcp_upstream import UpstreamSpec, bounded_stdio
from sagaplane_testkit import read_wal

from tests.support.waiting import wait_until, wait_until_async

ROOT = Path(__file__).resolve().parents[2]
SHOP = ROOT / "sdk" / "examples" / "mcp_shop_server.py"
POLICY = ROOT / "sdk" / "examples" / "mcp_shop_policy.toml"
SAGAPLANE = Path(sys.executable).parent / "sagaplane"
DEADLINE = 60.0


def gateway(tmp_path: Path, *options: str) -> UpstreamSpec:
    env = {"SAGAPLANE_WAL_DIR": str(tmp_path / "wal"), "SHOP_LEDGER": str(tmp_path / "ledger.jsonl")}
    command = [str(SAGAPLANE), "mcp-gateway", *options, "--", sys.executable, str(SHOP)]
    return UpstreamSpec(command=command, env=env, stderr=(tmp_path / "gateway.log").open("a"))


def run(spec: UpstreamSpec, scenario: Any) -> Any:
    async def main() -> Any:
        async with bounded_stdio(spec) as (read, write), ClientSession(read, write) as client:
            with anyio.fail_after(DEADLINE):
                await client.initialize()
                return await scenario(client)

    return anyio.run(main)


def wal_records(tmp_path: Path) -> list[dict[str, Any]]:
    (wal,) = (tmp_path / "wal").glob("*.wal")
    return read_wal(wal)


@pytest.mark.parametrize(
    ("tool", "arguments", "options"),
    [
        ("wait_forever", {}, ("--call-timeout", "2")),
        ("crash", {}, ()),
        ("huge", {"megabytes": 1}, ("--max-message-bytes", "65536")),
    ],
)
def test_an_upstream_that_hangs_dies_or_floods_leaves_the_outcome_unknown(
    tmp_path: Path, tool: str, arguments: dict[str, Any], options: tuple[str, ...]
) -> None:
    async def scenario(client: ClientSession) -> Any:
        return await client.call_tool(tool, arguments)

    result = run(gateway(tmp_path, "--policy", str(POLICY), *options), scenario)
    assert result.is_error and result.structured_content["reason"] == "outcome_unknown", result
    assert "unknown" in result.content[0].text
    events = [r["event"] for r in wal_records(tmp_path) if r.get("tool") == tool]
    assert events[:1] == ["STEP_INTENT"] and "STEP_UNKNOWN" in events, events


def test_garbage_from_the_client_is_answered_and_the_session_goes_on(tmp_path: Path) -> None:
    spec = gateway(tmp_path, "--policy", str(POLICY))
    process = subprocess.Popen(
        spec.command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=spec.stderr,
        env={**spec.env, "PATH": "/usr/bin:/bin"},
        text=True,
    )
    assert process.stdin is not None and process.stdout is not None
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    try:
        for line in ("{not json", '{"jsonrpc": "2.0", "id": 7, "method": 12}', "[]", json.dumps(initialize)):
            process.stdin.write(line + "\n")
        process.stdin.flush()
        answers = []
        while not any(a.get("id") == 1 for a in answers):
            line = process.stdout.readline()
            assert line, "the gateway closed its output"
            answers.append(json.loads(line))
        (ok,) = [a for a in answers if a.get("id") == 1]
        assert ok["result"]["serverInfo"]["name"].startswith("sagaplane-gateway")
        assert ok["result"]["capabilities"]["tools"] is not None
    finally:
        process.stdin.close()
        process.wait(timeout=DEADLINE)
    assert process.returncode == 0


def test_observe_mode_forwards_everything_and_writes_a_skeleton_policy(tmp_path: Path) -> None:
    emitted = tmp_path / "observed.toml"

    async def scenario(client: ClientSession) -> Any:
        listed = await client.list_tools()
        searched = await client.call_tool("search_products", {"query": "tea"})
        invoiced = await client.call_tool("send_invoice", {"customer": "ann"})
        return listed, searched, invoiced

    listed, searched, invoiced = run(
        gateway(tmp_path, "--observe", "--name", "shop", "--emit-policy", str(emitted)), scenario
    )
    assert not searched.is_error and not invoiced.is_error
    ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [e["tool"] for e in ledger] == ["search_products", "send_invoice"]
    skeleton = policy.load(emitted)
    assert skeleton.name == "shop" and skeleton.default is None
    assert sorted(r.pattern for r in skeleton.rules) == sorted(t.name for t in listed.tools)
    assert {r.semantics.value for r in skeleton.rules} == {"IRREVERSIBLE"}
    # Observe mode still records each call as a step (IRREVERSIBLE: nothing claimed undoable).
    intents = [r for r in wal_records(tmp_path) if r["event"] == "STEP_INTENT"]
    assert [(r["tool"], r["semantics"]) for r in intents] == [
        ("search_products", "IRREVERSIBLE"),
        ("send_invoice", "IRREVERSIBLE"),
    ]


def _port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
    except OSError:
        return False
    return True


async def _until_listening(port: int, gateway: subprocess.Popen[Any]) -> None:
    """Until the gateway process listens on `port` (failing at once if it exits first)."""
    await wait_until_async(
        lambda: _listening(port), "the gateway to listen", deadline=DEADLINE, every=0.1, alive=gateway
    )


def test_streamable_http_both_ways_with_a_client_token_and_a_session_end_completes_its_saga(
    tmp_path: Path,
) -> None:
    import os
    import signal

    from mcp.client.streamable_http import streamable_http_client

    upstream_port, gateway_port = _port(), _port()
    env = {
        **os.environ,
        "SAGAPLANE_WAL_DIR": str(tmp_path / "wal"),
        "SHOP_LEDGER": str(tmp_path / "ledger.jsonl"),
    }
    for key in ("SAGAPLANE_URL", "SAGAPLANE_API_KEY"):
        env.pop(key, None)
    env["SAGAPLANE_GATEWAY_TOKEN"] = "gateway-client-token"
    log = (tmp_path / "gateway.log").open("a")
    shop = subprocess.Popen(
        [sys.executable, str(SHOP), "--http", f"127.0.0.1:{upstream_port}"], env=env, stderr=log
    )
    wait_until(
        lambda: _listening(upstream_port), "the shop to listen", deadline=DEADLINE, every=0.1, alive=shop
    )
    command = [
        str(SAGAPLANE),
        "mcp-gateway",
        "--policy",
        str(POLICY),
        "--listen",
        f"127.0.0.1:{gateway_port}",
    ]
    command += ["--upstream-url", f"http://127.0.0.1:{upstream_port}/mcp"]
    gateway_process = subprocess.Popen(command, env=env, stderr=log)

    async def main() -> Any:
        with anyio.fail_after(DEADLINE):
            await _until_listening(gateway_port, gateway_process)
            url = f"http://127.0.0.1:{gateway_port}/mcp"
            from mcp.shared._httpx_utils import create_mcp_http_client

            anonymous = create_mcp_http_client()
            async with anonymous:
                refused = await anonymous.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
                assert refused.status_code == 401
            http = create_mcp_http_client(headers={"Authorization": "Bearer gateway-client-token"})
            async with (
                http,
                streamable_http_client(url, http_client=http) as (r, w),
                ClientSession(r, w) as client,
            ):
                await client.initialize()
                return await client.call_tool("charge_card", {"customer": "ann", "amount_cents": 3})

    try:
        charged = anyio.run(main)
        assert not charged.is_error, charged
        saga_id = (charged.meta or {})["sagaplane/saga_id"]
        wait_until(
            lambda: any(
                r["event"] == "SAGA_COMPLETE" and r["saga_id"] == saga_id for r in wal_records(tmp_path)
            ),
            "the session's end to complete its saga",
            deadline=DEADLINE,
            every=0.1,
        )
        assert gateway_process.poll() is None  # the gateway serves on; the session's saga is done
        gateway_process.send_signal(signal.SIGTERM)
        assert gateway_process.wait(timeout=DEADLINE) == 0
    finally:
        for process in (gateway_process, shop):
            if process.poll() is None:
                process.kill()
            process.wait(timeout=DEADLINE)


def test_sampling_passes_through_both_ways_and_the_upstream_sees_no_sagaplane_credentials(
    tmp_path: Path,
) -> None:
    import mcp_types as types

    asked: list[str] = []

    async def sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params.messages[0].content.text)  # type: ignore[union-attr]
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="forty-two"), model="fake"
        )

    spec = gateway(tmp_path, "--policy", str(POLICY))
    spec.env["SAGAPLANE_API_KEY"] = "sp_aaaaaaaaaaaa_the-gateways-own-secret"

    async def main() -> Any:
        async with (
            bounded_stdio(spec) as (read, write),
            ClientSession(read, write, sampling_callback=sampling) as client,
        ):
            with anyio.fail_after(DEADLINE):
                await client.initialize()
                chosen = await client.call_tool(
                    "ask_model", {"q": "the answer?"}, meta={"sagaplane/saga_id": "chosen-by-the-client"}
                )
                seen = await client.call_tool("environment", {})
                return chosen, seen

    chosen, seen = anyio.run(main)
    assert asked == ["the answer?"] and chosen.structured_content == {"answer": "forty-two"}
    assert (chosen.meta or {})["sagaplane/saga_id"] == "chosen-by-the-client"  # the client's saga id
    assert seen.structured_content == {"sagaplane": []}  # nothing of Sagaplane's reaches the server
    starts = [r["saga_id"] for r in wal_records(tmp_path) if r["event"] == "SAGA_START"]
    assert "chosen-by-the-client" in starts


def test_an_http_session_that_goes_silent_leaves_its_saga_to_recovery(tmp_path: Path) -> None:
    import os
    import signal

    from mcp.client.streamable_http import streamable_http_client

    upstream_port, gateway_port = _port(), _port()
    env = {k: v for k, v in os.environ.items() if k not in ("SAGAPLANE_URL", "SAGAPLANE_API_KEY")}
    env.update(SAGAPLANE_WAL_DIR=str(tmp_path / "wal"), SHOP_LEDGER=str(tmp_path / "ledger.jsonl"))
    log_path = tmp_path / "gateway.log"
    log = log_path.open("a")
    shop = subprocess.Popen(
        [sys.executable, str(SHOP), "--http", f"127.0.0.1:{upstream_port}"], env=env, stderr=log
    )
    command = [str(SAGAPLANE), "mcp-gateway", "--policy", str(POLICY), "--session-idle", "1"]
    command += [
        "--listen",
        f"127.0.0.1:{gateway_port}",
        "--upstream-url",
        f"http://127.0.0.1:{upstream_port}/mcp",
    ]
    gateway_process = subprocess.Popen(command, env=env, stderr=log)

    async def main() -> Any:
        with anyio.fail_after(DEADLINE):
            await _until_listening(gateway_port, gateway_process)
            url = f"http://127.0.0.1:{gateway_port}/mcp"
            # The client vanishes without ending its session (no DELETE).
            async with (
                streamable_http_client(url, terminate_on_close=False) as (r, w),
                ClientSession(r, w) as client,
            ):
                await client.initialize()
                return await client.call_tool("charge_card", {"customer": "ann", "amount_cents": 4})

    try:
        charged = anyio.run(main)
        saga_id = (charged.meta or {})["sagaplane/saga_id"]
        wait_until(
            lambda: f"saga {saga_id}: its HTTP session went silent" in log_path.read_text(),
            "the gateway to report the silent session",
            deadline=DEADLINE,
            every=0.1,
            context=lambda: log_path.read_text()[-3000:],
        )
        gateway_process.send_signal(signal.SIGTERM)
        assert gateway_process.wait(timeout=DEADLINE) == 0
    finally:
        for process in (gateway_process, shop):
            if process.poll() is None:
                process.kill()
            process.wait(timeout=DEADLINE)
    records = [r for r in wal_records(tmp_path) if r.get("saga_id") == saga_id]
    events = [r["event"] for r in records]
    # No terminal record: the control plane's lease runs out and recovery compensates the charge.
    assert "STEP_COMMITTED" in events and not {"SAGA_COMPLETE", "SAGA_ABORTED"} & set(events), events
