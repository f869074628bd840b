"""An OpenAI Agents SDK agent whose FunctionTools are governed by Sagaplane: a scripted Model (no
network, no API key: use your own model instead), a tool policy, one saga per run.

    python sdk/examples/openai_agents_agent.py              # local only: the WAL, no control plane
    SAGAPLANE_URL=http://127.0.0.1:8000 SAGAPLANE_API_KEY=sp_... \
        python sdk/examples/openai_agents_agent.py --amount 5000   # with an approval policy on `wire`:
                                                    # the run pauses until a person decides
    python sdk/examples/openai_agents_agent.py --fail   # the wire fails: the charge is refunded

The agent charges a card (COMPENSABLE), then wires money (IRREVERSIBLE). A call an approval policy
holds is the SDK's tool-approval interruption: this script waits for Sagaplane's decision
(`decide`), applies it to the run state and resumes the run; a refusal reaches the model as the
tool's output. Files go to `--dir` (default ./openai-agents-demo).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import sagaplane as sp
from agents import Agent, ModelResponse, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from sagaplane.integrations import openai_agents as spoa

POLICY = """\
name = "demo-shop"
default = "deny"

[tools.charge_card]
semantics = "COMPENSABLE"
compensate = { tool = "refund_charge", arguments = { charge_id = "{result.id}" } }

[tools.wire]
semantics = "IRREVERSIBLE"
"""
FAIL = {"wire": False}


@function_tool
def charge_card(amount: int) -> str:
    """Charge the customer's card; returns the charge."""
    print(f"  charge_card({amount})")
    return json.dumps({"id": f"ch_{amount}"})


@function_tool
def refund_charge(charge_id: str) -> str:
    """Refund a charge."""
    print(f"  refund_charge({charge_id})")
    return "refunded"


@function_tool(failure_error_function=None)  # a failure ends the run (and rolls the saga back)
def wire(amount: int, to: str) -> str:
    """Wire money to a supplier."""
    if FAIL["wire"]:
        raise ConnectionError("the bank's API is down")
    print(f"  wire({amount}, {to})")
    return f"sent {amount} to {to}"


class ScriptedModel(Model):
    """Stands in for a model: the user's message is a JSON list of turns of tool calls."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        turns = json.loads(
            next(i["content"] for i in items if isinstance(i, dict) and i.get("role") == "user")
        )
        made = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call")
        done = count = 0
        while done < len(turns) and count + len(turns[done]) <= made:
            count, done = count + len(turns[done]), done + 1
        if done < len(turns):
            output: list[Any] = [
                ResponseFunctionToolCall(
                    type="function_call", name=n, arguments=json.dumps(a), call_id=f"call_{done}_{i}"
                )
                for i, (n, a) in enumerate(turns[done])
            ]
        else:
            last = [
                i["output"] for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
            ]
            text = f"Done: {last[-1] if last else 'nothing to do'}"
            content = [ResponseOutputText(type="output_text", text=text, annotations=[])]
            output = [
                ResponseOutputMessage(
                    id="m", type="message", role="assistant", status="completed", content=content
                )
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


async def run(amount: int, policy: Path) -> None:
    tools = spoa.govern([charge_card, refund_charge, wire], policy=policy)
    agent = Agent(name="demo-shop", instructions="Follow the script.", model=ScriptedModel(), tools=tools)
    script = json.dumps([[["charge_card", {"amount": amount}]], [["wire", {"amount": amount, "to": "acme"}]]])
    try:
        result = await spoa.run(agent, script)
        while result.interruptions:
            state = result.to_state()
            print(f"waiting for a person to decide in Sagaplane: {[i.name for i in result.interruptions]}")
            while await spoa.decide(state, wait=20):
                pass
            result = await spoa.run(agent, state)
    except sp.SagaAborted as aborted:
        print(f"rolled back: {aborted}")
        return
    print(result.final_output)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", default="openai-agents-demo")
    parser.add_argument("--amount", type=int, default=40)
    parser.add_argument("--fail", action="store_true", help="the wire fails: the saga rolls back")
    args = parser.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.toml").write_text(POLICY)
    FAIL["wire"] = args.fail
    set_tracing_disabled(True)  # the SDK's own traces go to OpenAI; Sagaplane has the evidence
    sp.configure(folder / "agent.wal", agent="openai-agents-demo")  # SAGAPLANE_URL / _API_KEY when set
    asyncio.run(run(args.amount, folder / "tools.toml"))


if __name__ == "__main__":
    main()
    sp.shutdown()
