"""An agent-saga agent (the PyPI package, unchanged) asks for an approval: its WAL, shipped by its
own SagaCloudClient, puts the request in the queue; a member approves it through the API the
dashboard uses; `pull_approvals(status="granted", apply_to=store)` releases the waiting agent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from agent_saga import saga_scope
from agent_saga.approvals import ApprovalGateway, ApprovalPolicy, FileApprovalStore
from agent_saga.cloud import SagaCloudClient
from agent_saga.wal import FileWAL

from approvals.models import ApprovalRequest, Source, Status
from core.scoping import tenant_context
from tests.support.chains import server_stream
from tests.support.factories import Person
from tests.support.threads import in_thread
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.django_db(transaction=True)


class _Call:
    tool = "bank.wire"
    kwargs = {"amount": 25_000, "to": "supplier@acme.example"}


class _Rule:
    name = "wires-over-10k"
    reason = "a wire over 10,000 needs risk's approval"


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_pull_approvals_releases_an_agent_saga_agent(
    live_server: Any, alice: Person, ann: Person, tmp_path: Path
) -> None:
    wal_path, store = tmp_path / "agent.wal", FileApprovalStore(tmp_path / "approvals")
    client = SagaCloudClient(api_key=alice.api_key, endpoint=f"{live_server.url}/v1", raise_on_error=True)
    approver = ann.session_client()

    async def agent() -> bool:
        wal = FileWAL(str(wal_path))
        await wal.start()
        gateway = ApprovalGateway(store=store, wal=wal, policy=ApprovalPolicy(timeout=120, poll_interval=0.2))
        try:
            async with saga_scope(name="payout", wal=wal):
                return await gateway(_Call(), _Rule())
        finally:
            await wal.close()

    async def control_plane_side(waiting: asyncio.Task[bool]) -> str:
        """What the agent's shipping loop and a risk officer do meanwhile, until the agent is released."""
        voted = ""

        async def released() -> bool:
            """True once the agent is released; until then, one round of shipping and voting."""
            nonlocal voted
            if waiting.done():
                return True
            records = _lines(wal_path)
            if records:
                await client.push_wal_records(records)
            if not voted:
                queue = (await in_thread(approver.get, "/api/v1/approvals?status=pending")).json()
                if queue:
                    voted = queue[0]["id"]
                    answer = await in_thread(
                        approver.post,
                        f"/api/v1/approvals/{voted}/votes",
                        {"choice": "approve", "note": "ok"},
                        format="json",
                    )
                    assert answer.status_code == 201, answer.content
            else:
                await client.pull_approvals(status="granted", apply_to=store)
            return False

        await wait_until_async(released, "the agent to be released", every=0.1)
        return voted

    async def both() -> tuple[bool, str]:
        waiting = asyncio.create_task(agent())
        voted = await control_plane_side(waiting)
        return await asyncio.wait_for(waiting, 30), voted

    granted, voted = asyncio.run(both())
    assert granted is True and voted
    requested = next(r for r in _lines(wal_path) if r["event"] == "APPROVAL_REQUESTED")
    with tenant_context(alice.tenant):
        row = ApprovalRequest.objects.get(pk=voted)
    assert row.source == Source.AGENT_SAGA and row.external_id == requested["request_id"]
    assert row.status == Status.APPROVED and row.tool == "bank.wire" and row.args["amount"] == 25_000
    saga_start = next(r for r in _lines(wal_path) if r["event"] == "SAGA_START")
    assert row.saga_id == saga_start["saga_id"]
    pulled = asyncio.run(client.pull_approvals(status="granted"))
    assert pulled == [
        {
            **pulled[0],
            "id": requested["request_id"],
            "status": "GRANTED",
            "approver": "ann@acme.example",
            "note": "ok",
        }
    ]
    assert store.get(requested["request_id"]).approver == "ann@acme.example"  # type: ignore[union-attr]
    # The request and its decision are in the saga's evidence on the server.
    events = [r["event"] for r in server_stream(alice.tenant) if r.get("saga_id") == row.saga_id]
    assert events == ["APPROVAL_REQUESTED", "APPROVAL_VOTE", "APPROVAL_GRANTED"]


def test_the_queue_in_agent_sagas_shape_is_per_tenant_and_checks_its_status(
    live_server: Any, alice: Person, carol: Person
) -> None:
    client = SagaCloudClient(api_key=carol.api_key, endpoint=f"{live_server.url}/v1", raise_on_error=True)
    assert asyncio.run(client.pull_approvals(status="all")) == []
    response = carol.key_client().get("/v1/approvals?status=maybe")
    assert response.status_code == 400 and response.json()["field"] == "status"
