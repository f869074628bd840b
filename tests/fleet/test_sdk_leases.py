"""The SDK's lease holder against a live control plane: a cap of 10 shared by 16 sagas is spent to
the unit (leases while much is left, per call when little is), decisions on a lease are in the
WAL naming it, the ledger shows every lease returned with what it used, a halt revokes leases at
once, and a lease that cannot be renewed allows nothing past its TTL (fail closed)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from sagaplane.client import Client
from sagaplane.leases import LeaseHolder

from core.scoping import tenant_context
from fleet import services
from fleet.models import BudgetLimit, GateLease, LeaseState
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.sdk.sagaplane_testkit import read_wal as read_records
from tests.support.scoping import in_tenant
from tests.support.waiting import wait_until

pytestmark = pytest.mark.usefixtures("database_store")


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch, live_server: Any, alice: Any) -> str:
    monkeypatch.setenv("SAGAPLANE_URL", live_server.url)
    monkeypatch.setenv("SAGAPLANE_API_KEY", alice.api_key)
    return str(live_server.url)


def _spend(tool: Any, times: int) -> list[str]:
    answers = []
    for _ in range(times):
        try:
            with sp.saga(name="spend"):
                tool(1)
            answers.append("allow")
        except sp.SagaAborted as aborted:
            assert isinstance(aborted.cause, sp.GateDenied)
            answers.append(aborted.cause.reason)
    return answers


def test_a_cap_of_ten_is_spent_to_the_unit_on_leases_then_per_call(
    transactional_db: None, gated: str, alice: Any, tmp_path: Path
) -> None:
    tenant: Tenant = alice.tenant
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse({"name": "tokens", "tool": "llm.*", "max_total": 10, "window_s": 3600}),
        actor=named_actor("test"),
    )
    runtime = sp.configure(tmp_path / "l.wal", ship=False, agent="writer", gate_leases=True)
    try:
        assert runtime.gate is not None and runtime.gate.leases is not None
        runtime.gate.refresh()
        complete = sp.tool(lambda amount: amount, name="llm.complete", semantics=sp.REVERSIBLE)
        answers = _spend(complete, 16)
    finally:
        sp.shutdown()  # gives every lease back
    assert answers == ["allow"] * 10 + ["budget_exceeded"] * 6
    records = read_records(tmp_path / "l.wal")
    allows = [r for r in records if r["event"] == "GATE_ALLOW"]
    on_lease = [r for r in allows if r.get("lease")]
    assert len(allows) == 10 and on_lease and all(r["debits"] == {"tokens": "1"} for r in on_lease)
    with tenant_context(tenant):
        leases = list(GateLease.objects.all())
        assert leases and all(lease.state == LeaseState.RETURNED for lease in leases)
        assert sum(sum(lease.used or []) for lease in leases) == len(on_lease) * 10_000
        usage = services.budget_usage(BudgetLimit.objects.get(name="tokens"))
    assert usage[0]["used"] == "10" and usage[0]["leased"] == "0"


def test_a_halt_revokes_the_leases_at_once(
    transactional_db: None, gated: str, alice: Any, tmp_path: Path
) -> None:
    tenant: Tenant = alice.tenant
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse({"name": "tokens", "tool": "llm.*", "max_total": 1000, "window_s": 3600}),
        actor=named_actor("test"),
    )
    runtime = sp.configure(tmp_path / "h.wal", ship=False, agent="writer", gate_leases=True)
    try:
        assert runtime.gate is not None and runtime.gate.leases is not None
        runtime.gate.refresh()
        complete = sp.tool(lambda amount: amount, name="llm.complete", semantics=sp.REVERSIBLE)
        assert _spend(complete, 3) == ["allow"] * 3
        in_tenant(
            services.halt,
            tenant,
            services.HaltCreate.parse({"scope": "agent:nobody", "reason": "unrelated, but a change"}),
            actor=named_actor("test"),
        )

        def all_given_back() -> bool:
            with tenant_context(tenant):  # one short transaction a look (SQLite: no lock held between)
                return not GateLease.objects.filter(state=LeaseState.OUTSTANDING).exists()

        wait_until(all_given_back, "the leases given back after the change")
    finally:
        sp.shutdown()


def test_a_lease_that_cannot_be_renewed_allows_nothing_past_its_ttl(
    transactional_db: None, gated: str, alice: Any
) -> None:
    tenant: Tenant = alice.tenant
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse({"name": "tokens", "tool": "llm.*", "max_total": 1000, "window_s": 3600}),
        actor=named_actor("test"),
    )
    now = [100.0]
    holder = LeaseHolder(Client(gated, alice.api_key, timeout=5), clock=lambda: now[0])
    first = holder.decide("s1", "llm.complete", "w", {"amount": 1})
    assert first is not None and first["lease"] and Decimal(first["debits"]["tokens"]) == 1
    assert holder.decide("s1", "llm.complete", "w", {"amount": 1}) is not None  # in process
    # The control plane is cut off; the TTL passes: no renewal, no allow (the renewal that would
    # have given the lease back with its use never arrived).
    holder._ask = Client("http://127.0.0.1:1", alice.api_key, timeout=1)
    now[0] += 1.0
    assert holder.decide("s1", "llm.complete", "w", {"amount": 1}) is None
    with tenant_context(tenant):  # the held lease stays counted whole by the ledger
        assert GateLease.objects.filter(state=LeaseState.OUTSTANDING).count() == 1
