"""A scripted MCP agent that works through `sagaplane mcp-gateway` (no model: the calls are fixed),
for the demo: its sagas show in the dashboard beside the SDK demo agent's.

It starts the gateway as any MCP client would (stdio; `--boundary explicit`), with the example
shop server (mcp_shop_server.py) upstream and the example policy, and runs rounds: search,
charge a card, change an email, then commit -- or, one round in four, roll back (the gateway
refunds the charge and restores the email through the shop, newest first) -- and now and then
tries a tool the policy does not name (refused before it reaches the shop).

    SAGAPLANE_URL=... SAGAPLANE_API_KEY=... SAGAPLANE_WAL_DIR=/tmp/mcp-demo \\
        python sdk/examples/mcp_demo_agent.py --forever
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
from pathlib import Path

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

HERE = Path(__file__).resolve().parent


def gateway_parameters(ledger: str) -> StdioServerParameters:
    """How an MCP client starts the gateway (the same as a Claude Desktop / Cursor entry)."""
    env = {k: v for k, v in os.environ.items() if k.startswith("SAGAPLANE_")}
    env.setdefault("SAGAPLANE_AGENT", "mcp-shop-agent")
    env["SHOP_LEDGER"] = ledger
    args = ["-m", "sagaplane", "mcp-gateway", "--policy", str(HERE / "mcp_shop_policy.toml")]
    args += ["--boundary", "explicit", "--", sys.executable, str(HERE / "mcp_shop_server.py")]
    return StdioServerParameters(command=sys.executable, args=args, env=env)


async def one_round(client: ClientSession, rng: random.Random, n: int) -> str:
    customer = rng.choice(["ann", "bob", "cid"])
    await client.call_tool("search_products", {"query": rng.choice(["green", "black", "oolong"])})
    charged = await client.call_tool(
        "charge_card", {"customer": customer, "amount_cents": rng.randint(500, 9000)}
    )
    saga_id = (charged.meta or {}).get("sagaplane/saga_id", "?")
    if charged.is_error:
        return f"{saga_id}: charge refused ({charged.structured_content})"
    await client.call_tool("set_email", {"customer": customer, "email": f"{customer}+{n}@example.com"})
    if rng.random() < 0.2:
        refused = await client.call_tool("delete_customer", {"customer": customer})
        assert refused.is_error  # not in the policy: refused before the shop sees it
    if rng.random() < 0.25:
        rolled = await client.call_tool("saga_rollback", {})
        return f"{saga_id}: rolled back ({rolled.content[0].text})"
    await client.call_tool("saga_commit", {})
    return f"{saga_id}: committed"


async def run(rounds: int, forever: bool, pause: float, seed: int, ledger: str) -> None:
    rng = random.Random(seed)
    async with (
        stdio_client(gateway_parameters(ledger)) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        async with anyio.create_task_group() as tasks:

            async def stop_on_sigterm() -> None:
                # A stop ends the round in flight too (a round waits on the gate and the shop,
                # which a busy machine makes slow): closing the session below is a clean end,
                # and the gateway completes or rolls back what is open.
                with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                    async for _ in signals:
                        tasks.cancel_scope.cancel()
                        return

            tasks.start_soon(stop_on_sigterm)
            n = 0
            while forever or n < rounds:
                n += 1
                print(await one_round(client, rng, n), flush=True)
                await anyio.sleep(pause)
            tasks.cancel_scope.cancel()
    print("session closed", flush=True)  # the gateway completes what is open and exits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between rounds")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--ledger", default=None, help="the shop's ledger (default: beside the WAL)")
    args = parser.parse_args(argv)
    ledger = args.ledger or str(Path(os.environ.get("SAGAPLANE_WAL_DIR") or ".") / "shop-ledger.jsonl")
    Path(ledger).parent.mkdir(parents=True, exist_ok=True)
    anyio.run(run, args.rounds, args.forever, args.pause, args.seed, ledger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
