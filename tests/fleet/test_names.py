"""Names a caller chooses match halts, budgets, rate limits and approval policies case-insensitively
after Unicode NFKC normalisation (issue 23, item 7), on the control plane and in the SDK's local
view of halts and governed tools, through one function (`sagaplane.names`); the stored names
stay as sent.

Before: a halt on `tool:halted.*` let `HALTED.x` through, a budget on `amt.*` did not count
`AMT.PAY`, and `agent:bad-bot` did not stop `BAD-BOT`."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sagaplane import gate as sdk_gate
from sagaplane.names import glob_matches, name_key

from approvals import services as approvals
from core.scoping import tenant_context
from fleet import services
from fleet.gate import GateRequest, halt_matches, tool_matches
from fleet.models import GateDecision, Halt
from fleet.stores import DatabaseStore
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.scoping import in_statements, in_tenant

ACTOR = named_actor("test:names")


def _fullwidth(text: str) -> str:
    """ASCII letters and digits as their fullwidth look-alikes (NFKC maps them back)."""
    return "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() else c for c in text)


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("halted.*", "HALTED.x", True),
        ("amt.*", "AMT.PAY", True),
        ("amt.*", "Amt.Pay", True),
        ("amt.*", _fullwidth("AMT.PAY"), True),
        ("bank.wire", _fullwidth("bank.wire"), True),
        (_fullwidth("bank.*"), "BANK.wire", True),
        ("ﬁle.*", "FILE.read", True),  # the ligature ﬁ is "fi" in NFKC
        ("strasse.*", "STRAẞE.open", True),  # case folding: ẞ and ß are "ss"
        ("[a-c]*.charge", "B.charge", True),
        ("amt.*", "amtx.pay", False),
        ("halted.*", "halte.x", False),
        ("payments.charge", "payments.charges", False),
    ],
)
def test_a_glob_matches_whatever_the_case_and_look_alikes(pattern: str, name: str, matches: bool) -> None:
    assert glob_matches(pattern, name) is matches
    assert tool_matches(pattern, name) is matches  # the gate's and approvals' one rule


NAMES = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_", min_size=1, max_size=40
)


@given(NAMES)
def test_any_spelling_of_a_name_matches_it_and_its_globs(name: str) -> None:
    for spelled in (name.upper(), name.lower(), name.swapcase(), _fullwidth(name), _fullwidth(name.upper())):
        assert name_key(spelled) == name_key(name)
        assert glob_matches(name, spelled) and glob_matches(spelled, name)
        assert glob_matches(name.lower()[:1] + "*", spelled)


def _call(tool: str, agent: str = "billing-bot", tags: tuple[str, ...] = (), **args: Any) -> GateRequest:
    return GateRequest(
        saga_id=f"saga-{tool}-{agent}", step_id="1", tool=tool, args=args, agent=agent, tags=tags
    )


@pytest.mark.parametrize(
    ("scope", "request_"),
    [
        ("tool:halted.*", _call("HALTED.x")),
        ("tool:halted.*", _call(_fullwidth("halted.x"))),
        ("agent:bad-bot", _call("crm.read", agent="BAD-BOT")),
        ("agent:bad-bot", _call("crm.read", agent=_fullwidth("Bad-Bot"))),
        ("tag:prod", _call("crm.read", tags=("PROD",))),
    ],
)
def test_a_halt_stops_every_spelling_on_the_server_and_in_the_sdk(scope: str, request_: GateRequest) -> None:
    assert halt_matches(scope, request_)
    call = sdk_gate.Call(
        request_.saga_id,
        request_.step_id,
        request_.tool,
        "",
        dict(request_.args),
        request_.agent,
        request_.tags,
    )
    assert sdk_gate._halt_matches(scope, call)


def test_the_sdk_asks_the_gate_about_every_spelling_of_a_governed_tool() -> None:
    gate = sdk_gate.Gate("http://127.0.0.1:1", "sp_x_y", clock=lambda: 1000.0)
    gate._state = sdk_gate.FleetState(governed_tools=["amt.*"], read_at=1000.0)
    asked: list[dict[str, Any]] = []

    def ask(body: dict[str, Any]) -> dict[str, Any]:
        asked.append(body)
        return {"decision": "allow", "authorization_id": "a1"}

    gate._evaluate = ask  # type: ignore[method-assign]
    for tool in ("AMT.PAY", _fullwidth("amt.pay")):
        assert gate.check(sdk_gate.Call("s", "1", tool, "reversible", {"amount": 1})) is not None
    assert [body["tool"] for body in asked] == ["AMT.PAY", _fullwidth("amt.pay")]  # sent as spelled


def test_the_gate_refuses_and_counts_every_spelling_and_keeps_names_as_sent(tenant_a: Tenant) -> None:
    store = DatabaseStore()
    in_tenant(
        services.halt,
        tenant_a,
        services.HaltCreate.parse({"scope": "tool:halted.*", "reason": "incident"}),
        actor=ACTOR,
    )
    in_tenant(
        services.halt,
        tenant_a,
        services.HaltCreate.parse({"scope": "agent:bad-bot", "reason": "rogue"}),
        actor=ACTOR,
    )
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse(
            {"name": "pay", "tool": "amt.*", "argument": "amount", "max_total": 100, "window_s": 3600}
        ),
        actor=ACTOR,
    )

    def ask(request: GateRequest) -> dict[str, Any]:
        return in_statements(services.evaluate, tenant_a, request, actor=ACTOR, store=store)

    assert ask(_call("HALTED.x"))["reason"] == "halted"
    assert ask(_call("crm.read", agent="BAD-BOT"))["reason"] == "halted"
    assert ask(_call("AMT.PAY", amount=60))["decision"] == "allow"
    refused = ask(_call(_fullwidth("amt.pay"), amount=60))  # the same budget: 120 > 100
    assert refused["decision"] == "deny" and refused["reason"] == "budget_exceeded"
    with tenant_context(tenant_a):
        assert {h.scope for h in Halt.objects.all()} == {"tool:halted.*", "agent:bad-bot"}
        tools = set(GateDecision.objects.values_list("tool", flat=True))
    assert {"HALTED.x", "AMT.PAY", _fullwidth("amt.pay")} <= tools


def test_a_per_tool_or_per_agent_limit_counts_every_spelling_once(tenant_a: Tenant) -> None:
    store = DatabaseStore()
    in_tenant(
        services.create_rate_limit,
        tenant_a,
        services.RateLimitCreate.parse(
            {"name": "calls", "tool": "*", "per": ["agent", "tool"], "max_calls": 1, "window_s": 3600}
        ),
        actor=ACTOR,
    )
    first = in_statements(
        services.evaluate, tenant_a, _call("crm.read", agent="bot"), actor=ACTOR, store=store
    )
    assert first["decision"] == "allow"
    again = in_statements(
        services.evaluate, tenant_a, _call("CRM.READ", agent="BOT"), actor=ACTOR, store=store
    )
    assert again["decision"] == "deny" and again["reason"] == "rate_limited"


def test_an_approval_policy_matches_every_spelling(tenant_a: Tenant) -> None:
    in_tenant(
        approvals.create_policy,
        tenant_a,
        approvals.PolicyCreate.parse({"name": "wires", "tool": "bank.*", "required_approvals": 1}),
        actor=ACTOR,
    )
    for tool in ("BANK.wire", _fullwidth("bank.wire")):
        answer = in_statements(
            services.evaluate, tenant_a, _call(tool, amount=5), actor=ACTOR, store=DatabaseStore()
        )
        assert answer["decision"] == "pending_approval", (tool, answer)
