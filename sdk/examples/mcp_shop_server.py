"""A small MCP server (a shop) to put behind `sagaplane mcp-gateway`, written with the `mcp`
package's low-level server. Every call it receives is appended to a JSON-lines ledger
($SHOP_LEDGER, default ./shop-ledger.jsonl), so you can see what reached it -- and what did not.

    python sdk/examples/mcp_shop_server.py                    # stdio
    python sdk/examples/mcp_shop_server.py --http 127.0.0.1:9000   # streamable HTTP at /mcp

Tools: search_products (a read), charge_card / refund_charge (an effect and its compensation,
refunds applied once per idempotency key), get_email / set_email (state a compensation
restores), send_invoice (nothing undoes it), a resource and a prompt (passed through the gateway
untouched), and for tests: wait_forever (never answers), huge (a very large answer), crash (the
server exits mid-call), ask_model (sampling through the client) and environment.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server

LEDGER = Path(os.environ.get("SHOP_LEDGER", "shop-ledger.jsonl"))
KEEP_LEDGER = os.environ.get("SHOP_LEDGER") != ""  # SHOP_LEDGER= (empty): keep none (benchmarks)
IDEMPOTENCY_META = "sagaplane/idempotency_key"


def _schema(**props: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {k: {"type": v} for k, v in props.items()},
        "required": list(props),
    }


TOOLS = [
    types.Tool(name="search_products", description="Find products", input_schema=_schema(query="string")),
    types.Tool(
        name="charge_card",
        description="Charge a customer's card",
        input_schema=_schema(customer="string", amount_cents="integer"),
    ),
    types.Tool(name="refund_charge", description="Refund a charge", input_schema=_schema(charge_id="string")),
    types.Tool(name="get_email", description="A customer's email", input_schema=_schema(customer="string")),
    types.Tool(
        name="set_email",
        description="Change a customer's email",
        input_schema=_schema(customer="string", email="string"),
    ),
    types.Tool(name="send_invoice", description="Email an invoice", input_schema=_schema(customer="string")),
    types.Tool(name="wait_forever", description="Never answers", input_schema=_schema()),
    types.Tool(name="huge", description="A very large answer", input_schema=_schema(megabytes="number")),
    types.Tool(name="crash", description="The server dies mid-call", input_schema=_schema()),
    types.Tool(
        name="ask_model", description="Asks the client's model (sampling)", input_schema=_schema(q="string")
    ),
    types.Tool(name="environment", description="Which SAGAPLANE_* variables it sees", input_schema=_schema()),
]


def ledger() -> list[dict[str, Any]]:
    if not KEEP_LEDGER or not LEDGER.exists():
        return []
    return [json.loads(line) for line in LEDGER.read_text().splitlines() if line.strip()]


def record(entry: dict[str, Any]) -> None:
    if not KEEP_LEDGER:
        return
    with LEDGER.open("a") as fh:
        fh.write(json.dumps(entry) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def emails() -> dict[str, str]:
    out = {"ann": "ann@old.example"}
    for entry in ledger():
        if entry["tool"] == "set_email":
            out[entry["arguments"]["customer"]] = entry["arguments"]["email"]
    return out


def answer(data: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(data))], structured_content=data
    )


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    name, args = params.name, dict(params.arguments or {})
    key = (params.meta or {}).get(IDEMPOTENCY_META)
    if name == "wait_forever":
        record({"tool": name, "arguments": args, "at": time.time()})
        await anyio.sleep_forever()
    if name == "crash":
        record({"tool": name, "arguments": args, "at": time.time()})
        os._exit(3)
    if name == "ask_model":
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=args["q"]))
        reply = await ctx.session.create_message([message], max_tokens=50, related_request_id=ctx.request_id)
        return answer({"answer": getattr(reply.content, "text", "")})
    if name == "environment":
        return answer({"sagaplane": sorted(k for k in os.environ if k.startswith("SAGAPLANE_"))})
    if name == "huge":
        return answer({"blob": "x" * int(float(args.get("megabytes", 1)) * (1 << 20))})
    if name == "refund_charge" and key and any(e.get("key") == key for e in ledger() if e["tool"] == name):
        return answer({"refunded": args["charge_id"], "repeat": True})  # applied once per key
    result: dict[str, Any] = {"ok": True}
    if name == "search_products":
        result = {"products": [{"sku": "tea-1", "name": f"{args.get('query', '')} tea"}]}
    elif name == "charge_card":
        if float(args.get("amount_cents", 0)) <= 0:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text="amount_cents must be positive")], is_error=True
            )
        result = {"id": f"ch_{secrets.token_hex(4)}", "amount_cents": args["amount_cents"]}
    elif name == "refund_charge":
        result = {"refunded": args["charge_id"]}
    elif name == "get_email":
        result = {"email": emails().get(args["customer"], "")}
    record({"tool": name, "arguments": args, "key": key, "result": result, "at": time.time()})
    return answer(result)


async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[types.Resource(uri="shop://catalog", name="catalog")])


async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    text = json.dumps({"uri": str(params.uri), "items": ["tea-1"]})
    return types.ReadResourceResult(contents=[types.TextResourceContents(uri=str(params.uri), text=text)])


async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[types.Prompt(name="greet", description="Say hello")])


async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    message = types.PromptMessage(
        role="user", content=types.TextContent(type="text", text="hello from the shop")
    )
    return types.GetPromptResult(messages=[message])


def server() -> Server[Any]:
    return Server(
        "shop",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )


async def main_stdio() -> None:
    from mcp.server.stdio import stdio_server

    app = server()
    async with stdio_server() as (read, write):
        await app.run(read, write, app.create_initialization_options())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", default=None, metavar="HOST:PORT")
    args = parser.parse_args()
    if args.http is None:
        anyio.run(main_stdio)
        return
    import uvicorn

    host, _, port = args.http.rpartition(":")
    uvicorn.run(server().streamable_http_app(host=host), host=host, port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
