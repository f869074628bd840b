"""`sagaplane mcp-gateway` for real: a real MCP client session (the `mcp` package) through the
gateway (a process of its own) to a real upstream MCP server (sdk/examples/mcp_shop_server.py,
which writes every call it receives to a ledger), against a running control plane. A call ships
its step; a halt, a tool the policy does not name, a budget refusal and a denied approval never
reach the upstream; an approved call runs once; a rollback compensates newest first; the gateway
SIGKILLed leaves its saga to a recovery worker that compensates through the upstream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from sagaplane.integrations.mcp_upstream import UpstreamSpec, bounded_stdio

from approvals import services as approvals
from core.scoping import tenant_context
from fleet import services as fleet
from fleet.stores import DatabaseStore
from recovery.models import Job
from recovery.tasks import sweep_tenant
from sagas.models import Saga, Step
from tenants import services as tenants
from tenants.actors import named_actor, user_actor
from tenants.inputs import NewApiKey
from tenants.models import Membership, Role, Tenant
from tests.support.factories import ALL_SCOPES, Person, make_person
from tests.support.scoping import in_tenant
from tests.support.threads import in_thread
from tests.support.waiting import wait_until, wait_until_async

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "sdk" / "examples"
SHOP = EXAMPLES / "mcp_shop_server.py"
POLICY = EXAMPLES / "mcp_shop_policy.toml"
BIN = Path(sys.executable).parent
DEADLINE = 60.0


@pytest.fixture(autouse=True)
def _database_store() -> Any:
    fleet.set_store(DatabaseStore())
    yield
    fleet.set_store(None)


class Shop:
    """The gateway's environment and what reached the upstream."""

    def __init__(self, url: str, key: str, folder: Path) -> None:
        self.url, self.key, self.folder = url, key, folder
        self.ledger = folder / "ledger.jsonl"

    def env(self) -> dict[str, str]:
        return {
            "SAGAPLANE_URL": self.url,
            "SAGAPLANE_API_KEY": self.key,
            "SAGAPLANE_WAL_DIR": str(self.folder / "wal"),
            "SHOP_LEDGER": str(self.ledger),
            "PYTHONPATH": str(ROOT),
        }

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        rows = [json.loads(line) for line in self.ledger.read_text().splitlines() if line.strip()]
        return [r for r in rows if tool is None or r["tool"] == tool]

    def gateway(self, *options: str) -> UpstreamSpec:
        command = [str(BIN / "sagaplane"), "mcp-gateway", "--policy", str(POLICY), *options]
        return UpstreamSpec(
            command=[*command, "--", sys.executable, str(SHOP)], env=self.env(), stderr=self.stderr()
        )

    def stderr(self) -> Any:
        return (self.folder / "gateway.log").open("a")

    def log(self) -> str:
        path = self.folder / "gateway.log"
        return path.read_text()[-4000:] if path.exists() else ""


@pytest.fixture
def agent_key(tenant_a: Tenant, alice: Person) -> str:
    _, raw = in_tenant(
        tenants.create_api_key,
        tenant_a,
        NewApiKey(name="mcp-gateway", scopes=ALL_SCOPES),
        created_by=alice.user,
        actor=named_actor("test"),
    )
    return raw


@pytest.fixture
def shop(live_server: Any, agent_key: str, tmp_path: Path) -> Shop:
    return Shop(live_server.url, agent_key, tmp_path)


def session(spec: UpstreamSpec, scenario: Callable[[ClientSession], Any]) -> Any:
    """Run `scenario` with an initialized client session through the gateway."""

    async def main() -> Any:
        async with bounded_stdio(spec) as (read, write), ClientSession(read, write) as client:
            with anyio.fail_after(DEADLINE):
                await client.initialize()
                return await scenario(client)

    return anyio.run(main)


def steps(tenant: Tenant, saga_id: str) -> list[tuple[str, str]]:
    with tenant_context(tenant):
        return [(s.tool, s.status) for s in Step.objects.filter(saga__saga_id=saga_id).order_by("ordinal")]


def test_a_call_through_the_gateway_is_a_step_the_control_plane_holds(shop: Shop, tenant_a: Tenant) -> None:
    async def scenario(client: ClientSession) -> Any:
        listed = await client.list_tools()
        charged = await client.call_tool("charge_card", {"customer": "ann", "amount_cents": 5})
        resources = await client.read_resource("shop://catalog")  # passed through untouched
        prompt = await client.get_prompt("greet")
        return listed, charged, resources, prompt

    listed, charged, resources, prompt = session(shop.gateway(), scenario)
    tools = {t.name: t for t in listed.tools}
    assert tools["search_products"].annotations.read_only_hint is True
    assert tools["send_invoice"].annotations.destructive_hint is True
    assert (
        "wait_forever" in tools and (tools["charge_card"].meta or {})["sagaplane/semantics"] == "COMPENSABLE"
    )
    assert not charged.is_error and charged.structured_content["amount_cents"] == 5
    saga_id = (charged.meta or {})["sagaplane/saga_id"]
    assert "tea-1" in resources.contents[0].text and prompt.messages[0].content.text == "hello from the shop"
    # The session ended cleanly: the saga completed; its step reached the control plane committed.
    wait_until(
        lambda: steps(tenant_a, saga_id) == [("charge_card", "committed")],
        "the step to be shipped",
        deadline=DEADLINE,
        every=0.1,
    )
    with tenant_context(tenant_a):
        wait_until(
            lambda: Saga.objects.get(saga_id=saga_id).status == "completed",
            "the saga to complete",
            deadline=DEADLINE,
            every=0.1,
        )
        saga = Saga.objects.get(saga_id=saga_id)
        assert saga.agent == "mcp-gateway-shop"
        step = Step.objects.get(saga=saga)
        assert step.compensation["handler"] == "shop:refund_charge"
        assert step.compensation["kwargs"] == {"arguments": {"charge_id": charged.structured_content["id"]}}
    assert [c["tool"] for c in shop.calls()] == ["charge_card"]


def test_refusals_never_reach_the_upstream(shop: Shop, tenant_a: Tenant, alice: Person) -> None:
    in_tenant(
        fleet.halt,
        tenant_a,
        fleet.HaltCreate.parse({"scope": "tool:search_products", "reason": "incident 7"}),
        actor=user_actor("alice"),
    )
    in_tenant(
        fleet.create_budget,
        tenant_a,
        fleet.BudgetCreate.parse(
            {
                "name": "cards",
                "max_total": 10,
                "window_s": 3600,
                "tool": "charge_card",
                "argument": "amount_cents",
            }
        ),
        actor=user_actor("alice"),
    )
    ann = make_person(tenant_a, "ann", Role.APPROVER)
    in_tenant(
        approvals.create_policy,
        tenant_a,
        approvals.PolicyCreate.parse(
            {"name": "invoices", "tool": "send_invoice", "predicates": [], "required_approvals": 1}
        ),
        actor=user_actor("alice"),
    )

    async def scenario(client: ClientSession) -> Any:
        halted = await client.call_tool("search_products", {"query": "tea"})
        unknown = await client.call_tool("format_disk", {})
        over = await client.call_tool("charge_card", {"customer": "ann", "amount_cents": 50})
        async with anyio.create_task_group() as tg:
            denied: list[types.CallToolResult] = []

            async def invoice() -> None:
                denied.append(await client.call_tool("send_invoice", {"customer": "ann"}))

            tg.start_soon(invoice)
            row = await in_thread(lambda: pending(tenant_a))
            await in_thread(lambda: vote(ann, row, "deny"))
        return halted, unknown, over, denied[0]

    halted, unknown, over, denied = session(shop.gateway(), scenario)
    for result, reason in (
        (halted, "halted"),
        (unknown, "not_in_policy"),
        (over, "budget_exceeded"),
        (denied, "approval_denied"),
    ):
        assert result.is_error, (reason, shop.log())
        assert result.structured_content["reason"] == reason, result.structured_content
        assert result.content[0].text  # a sentence for the model
    assert "incident 7" in halted.content[0].text
    assert shop.calls() == []  # nothing reached the upstream


def pending(tenant: Tenant) -> Any:
    from approvals.models import ApprovalRequest, Status

    def row() -> Any:
        with tenant_context(tenant):
            return ApprovalRequest.objects.filter(status=Status.PENDING).first()

    return wait_until(row, "the approval request", deadline=DEADLINE, every=0.1)


def vote(person: Person, row: Any, choice: str) -> None:
    with tenant_context(person.tenant):
        member = Membership.objects.select_related("user", "tenant").get(user=person.user)
    in_tenant(approvals.vote, person.tenant, row.pk, member, choice, "", actor=user_actor(person.user.email))


def test_an_approved_call_waits_with_progress_and_runs_once(shop: Shop, tenant_a: Tenant) -> None:
    ann = make_person(tenant_a, "ann", Role.APPROVER)
    in_tenant(
        approvals.create_policy,
        tenant_a,
        approvals.PolicyCreate.parse(
            {"name": "invoices", "tool": "send_invoice", "predicates": [], "required_approvals": 1}
        ),
        actor=user_actor("alice"),
    )
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def scenario(client: ClientSession) -> Any:
        async with anyio.create_task_group() as tg:
            results: list[types.CallToolResult] = []

            async def invoice() -> None:
                results.append(
                    await client.call_tool("send_invoice", {"customer": "ann"}, progress_callback=on_progress)
                )

            tg.start_soon(invoice)
            row = await in_thread(lambda: pending(tenant_a))
            # The gateway says it is waiting before the vote.
            await wait_until_async(lambda: progress, "the gateway's progress", deadline=DEADLINE)
            assert shop.calls() == []
            await in_thread(lambda: vote(ann, row, "approve"))
        return results[0]

    result = session(shop.gateway(), scenario)
    assert not result.is_error, result
    assert any("waiting for approval" in message for message in progress), progress
    assert [c["tool"] for c in shop.calls()] == ["send_invoice"]


def test_an_explicit_rollback_compensates_through_the_upstream_newest_first(shop: Shop) -> None:
    async def scenario(client: ClientSession) -> Any:
        charged = await client.call_tool("charge_card", {"customer": "ann", "amount_cents": 5})
        await client.call_tool("set_email", {"customer": "ann", "email": "ann@new.example"})
        rolled = await client.call_tool("saga_rollback", {})
        return charged, rolled

    charged, rolled = session(shop.gateway("--boundary", "explicit"), scenario)
    assert rolled.structured_content["outcome"] == "rolled_back", rolled
    assert rolled.structured_content["compensated"] == ["set_email", "charge_card"]
    calls = shop.calls()
    assert [c["tool"] for c in calls] == [
        "charge_card",
        "get_email",
        "set_email",
        "set_email",
        "refund_charge",
    ]
    assert calls[3]["arguments"] == {"customer": "ann", "email": "ann@old.example"}  # the captured state
    assert calls[4]["arguments"] == {"charge_id": charged.structured_content["id"]}
    assert calls[3]["key"] and calls[4]["key"]  # each compensation carries its idempotency key


def test_a_gateway_killed_mid_session_is_compensated_by_a_recovery_worker(
    shop: Shop, tenant_a: Tenant, agent_key: str
) -> None:
    spec = shop.gateway("--lease-ttl", "2")

    async def scenario(client: ClientSession) -> Any:
        charged = await client.call_tool("charge_card", {"customer": "ann", "amount_cents": 7})
        saga_id = (charged.meta or {})["sagaplane/saga_id"]
        await in_thread(
            lambda: wait_until(
                lambda: steps(tenant_a, saga_id) == [("charge_card", "committed")],
                "the commit",
                deadline=DEADLINE,
                every=0.1,
            )
        )
        os.kill(gateway_pid(shop), signal.SIGKILL)  # mid-session: no terminal record
        return charged

    charged = session(spec, scenario)
    saga_id = (charged.meta or {})["sagaplane/saga_id"]

    def taken_over() -> bool:
        sweep_tenant(tenant_a)
        with tenant_context(tenant_a):
            return Job.objects.filter(saga_id=saga_id).exists()

    wait_until(
        taken_over, "the lease to run out and the sweep to take the saga over", deadline=DEADLINE, every=0.1
    )
    worker = subprocess.Popen(
        [str(BIN / "sagaplane"), "worker", "--policy", str(POLICY), "--max-jobs", "1", "--wait", "5"]
        + ["--", sys.executable, str(SHOP)],
        env={**os.environ, **shop.env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = worker.communicate(timeout=DEADLINE * 2)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, out
    refunds = shop.calls("refund_charge")
    assert [r["arguments"] for r in refunds] == [{"charge_id": charged.structured_content["id"]}], out
    with tenant_context(tenant_a):
        (job,) = Job.objects.filter(saga_id=saga_id)
        assert job.state == "compensated" and job.handler == "shop:refund_charge"
        assert refunds[0]["key"] == job.idempotency_key


def gateway_pid(shop: Shop) -> int:
    """The gateway's process id, from its WAL's SAGA_START."""
    for wal in (shop.folder / "wal").glob("*.wal"):
        for line in wal.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "SAGA_START":
                return int(record["pid"])
    raise AssertionError("no SAGA_START in the gateway's WAL")
