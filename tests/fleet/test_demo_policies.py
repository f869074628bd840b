"""`seed_demo` gives the demo tenant a budget and a rate limit on the demo agent's own tools
(sdk/examples/demo_agent.py), once, so `make run` shows moving gauges and some denials."""

from __future__ import annotations

import ast
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from core.scoping import tenant_context
from fleet import services
from fleet.gate import GateRequest
from fleet.models import BudgetLimit, RateLimit
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.scoping import in_statements

DEMO_AGENT = Path(__file__).resolve().parents[2] / "sdk" / "examples" / "demo_agent.py"


pytestmark = pytest.mark.usefixtures("database_store")


def _tool_arguments() -> dict[str, list[str]]:
    """The demo agent's tools and their argument names, read from its source."""
    tree = ast.parse(DEMO_AGENT.read_text())
    return {
        node.name: [a.arg for a in node.args.args]
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(
            isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "tool" for d in node.decorator_list
        )
    }


def test_seed_demo_sets_a_budget_and_a_rate_limit_on_the_demo_agents_tools_once(
    db: None, settings: Any, tmp_path: Path
) -> None:
    settings.DATA_DIR = tmp_path
    for _ in range(2):
        call_command("seed_demo", "--sagas", "0", stdout=StringIO())
    tenant = Tenant.objects.get(slug="demo")
    with tenant_context(tenant):
        budget = BudgetLimit.objects.get()
        rate = RateLimit.objects.get()
    tools = _tool_arguments()
    assert budget.argument in tools[budget.tool] and rate.tool in tools
    # The demo's largest checkout (4 × 49.99) fits; a minute of them reaches the cap.
    calls = [
        in_statements(
            services.evaluate,
            tenant,
            GateRequest(
                saga_id=f"s{n}",
                step_id="2",
                tool=budget.tool,
                args={"customer": "c", budget.argument: 19_996},
            ),
            actor=named_actor("test"),
        )["decision"]
        for n in range(20)
    ]
    allowed = calls.count("allow")
    assert calls == ["allow"] * allowed + ["deny"] * (20 - allowed) and 0 < allowed < 20


def test_seed_demo_sets_an_approval_policy_the_demo_agents_payouts_meet(
    db: None, settings: Any, tmp_path: Path
) -> None:
    """Approvals show life in the demo: every supplier payout the demo agent asks for waits for a
    person (`pay_supplier` is one of its tools, `amount` its argument), made once."""
    from approvals.models import ApprovalPolicy

    settings.DATA_DIR = tmp_path
    for _ in range(2):
        call_command("seed_demo", "--sagas", "0", stdout=StringIO())
    tenant = Tenant.objects.get(slug="demo")
    with tenant_context(tenant):
        policy = ApprovalPolicy.objects.get()
    tools = _tool_arguments()
    assert policy.tool in tools and policy.enabled
    assert all(p["arg"] in tools[policy.tool] for p in policy.predicates)
    answer = in_statements(
        services.evaluate,
        tenant,
        GateRequest(
            saga_id="p1",
            step_id="1",
            tool=policy.tool,
            args={"supplier": "s", "amount": 2_000, "currency": "USD"},
        ),
        actor=named_actor("test"),
    )
    assert answer["decision"] == "pending_approval", answer


def test_the_demo_agent_observes_its_compensations() -> None:
    """Reconciliation shows life in the demo: each compensation the demo agent can check in its own
    state has an observer (`@sp.reconciler`) of the same name."""
    source = DEMO_AGENT.read_text()
    tree = ast.parse(source)
    names = {
        kind: {
            d.args[0].value
            for node in tree.body
            if isinstance(node, ast.FunctionDef)
            for d in node.decorator_list
            if isinstance(d, ast.Call)
            and getattr(d.func, "attr", "") == kind
            and isinstance(d.args[0], ast.Constant)
        }
        for kind in ("compensator", "reconciler")
    }
    assert (
        {"demo.refund", "demo.cancel_shipment", "demo.reverse_payout"}
        <= names["reconciler"]
        <= names["compensator"]
    )
    assert "ReconcileWorker(" in source
