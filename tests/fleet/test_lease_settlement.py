"""An agent that dies holding a budget lease (issue 28): its outstanding units stay counted until
the lease expires; then the settlement counts what its shipped WAL proves was spent and gives the
rest back — with a real agent process, its WAL shipped over HTTP, SIGKILLed. And the settlement's
edges: a holder's return wins over it, a late return counts its excess as an overrun, hostile
GATE_ALLOW records count nothing that is not an amount of a lease."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sagaplane.events import Event

from core.scoping import tenant_context
from fleet import services, tasks
from fleet.gate import GateRequest
from fleet.models import BudgetLimit, GateLease, LeaseState, LeaseUse
from recovery import sweeper
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.fleet import stores
from tests.fleet.concurrency import ROOT
from tests.hostile.production import OwnRedis
from tests.sdk.sagaplane_testkit import read_wal
from tests.support.chains import Writer
from tests.support.scoping import in_statements, in_tenant
from tests.support.waiting import wait_until

ACTOR = named_actor("test:settlement")
private_redis = stores.private_redis  # a private Redis to flush (tests/fleet/stores.py)
UNIT = 10_000  # one amount of 1, in the gate's units


pytestmark = pytest.mark.usefixtures("database_store")


def _budget(tenant: Tenant) -> None:
    body = {"name": "tokens", "tool": "llm.*", "max_total": 1000, "window_s": 3600}
    in_tenant(services.create_budget, tenant, services.BudgetCreate.parse(body), actor=ACTOR)


def _usage(tenant: Tenant) -> dict[str, Any]:
    with tenant_context(tenant):
        return services.budget_usage(BudgetLimit.objects.get(name="tokens"))[0]


def _outstanding(tenant: Tenant) -> list[GateLease]:
    with tenant_context(tenant):
        return list(GateLease.objects.filter(state=LeaseState.OUTSTANDING))


def test_a_killed_agents_lease_is_settled_at_what_its_wal_shipped(
    transactional_db: None, live_server: Any, alice: Any, tmp_path: Path
) -> None:
    tenant: Tenant = alice.tenant
    _budget(tenant)
    # A long TTL: "before expiry" below is certain whatever the machine's load.
    in_tenant(
        services.set_fleet_settings, tenant, services.FleetSettingsChange(lease_ttl_ms=60_000), actor=ACTOR
    )
    wal = tmp_path / "dying.wal"
    env = {**os.environ, "SAGAPLANE_URL": live_server.url, "SAGAPLANE_API_KEY": alice.api_key}
    agent = subprocess.Popen(
        [sys.executable, "-m", "tests.fleet.lease_agent", str(wal), "3"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert agent.stdout is not None
        line = agent.stdout.readline()
        assert line.strip() == "spent", agent.stderr.read() if agent.stderr else line

        def shipped() -> bool:
            with tenant_context(tenant):
                return LeaseUse.objects.count() == 3

        wait_until(shipped, "the agent's three decisions on leases shipped and counted")
    finally:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=30)

    allows = [r for r in read_wal(wal) if r["event"] == "GATE_ALLOW"]
    assert len(allows) == 3 and all(r.get("lease") for r in allows)  # every call decided on a lease
    held = _outstanding(tenant)
    assert len(held) == 1, held  # earlier leases were given back by the renewals
    lease = held[0]
    granted = int(lease.debits[0]["amount"])
    with tenant_context(tenant):
        on_it = services.lease_shipped_use(lease)[0]
    assert granted > on_it > 0
    # Dead, but not expired: every unit it was granted stays counted.
    before = _usage(tenant)
    assert int(float(before["used"]) * UNIT) == 3 * UNIT - on_it + granted
    assert int(float(before["leased"]) * UNIT) == granted
    assert tasks.settle_tenant(tenant) == 0

    # Past its expiry and the grace: settled at what its WAL shipped, the rest back.
    assert tasks.settle_tenant(tenant, now=lease.settle_after + timedelta(seconds=1)) == 1
    with tenant_context(tenant):
        lease.refresh_from_db()
    assert lease.state == LeaseState.SETTLED and lease.used == [on_it]
    after = _usage(tenant)
    assert after["used"] == "3" and after["leased"] == "0"  # = what the WAL shipped
    assert tasks.settle_tenant(tenant, now=lease.settle_after + timedelta(seconds=60)) == 0
    # The counters the next decision reads agree: the rest of the cap is usable.
    request = GateRequest(saga_id="next", step_id="1", tool="llm.complete", args={"amount": 997}, agent="w")
    assert in_statements(services.evaluate, tenant, request, actor=ACTOR)["decision"] == "allow"


def _grant(tenant: Tenant, calls: int = 4) -> uuid.UUID:
    lease_id = uuid.uuid4()
    request = GateRequest(saga_id="s", step_id="s", tool="llm.complete", args={"amount": 1}, agent="w")
    answer = in_tenant(services.grant_lease, tenant, request, calls=calls, lease_id=lease_id, actor=ACTOR)
    assert answer["decision"] == "lease", answer
    return lease_id


def _ship_uses(tenant: Tenant, *debits: Any, lease: Any) -> None:
    writer = Writer(tenant, f"agent-{uuid.uuid4().hex[:8]}")
    writer.ship(
        *[
            (
                Event.GATE_ALLOW,
                {"saga_id": f"s{n}", "step_id": "1", "tool": "llm.complete", "lease": lease, "debits": d},
            )
            for n, d in enumerate(debits)
        ]
    )


def _due(lease_id: uuid.UUID, tenant: Tenant) -> Any:
    with tenant_context(tenant):
        return GateLease.objects.get(pk=lease_id).settle_after + timedelta(seconds=1)


def test_hostile_records_count_nothing_but_amounts_of_a_lease(tenant_a: Tenant) -> None:
    _budget(tenant_a)
    lease_id = _grant(tenant_a)
    _ship_uses(
        tenant_a, {"tokens": "1"}, {"tokens": 1}, {"tokens": "-1"}, {"tokens": "1e999"}, lease=str(lease_id)
    )
    _ship_uses(tenant_a, {"tokens": True}, {"tokens": [1]}, {"other": "5"}, "tokens", lease=str(lease_id))
    _ship_uses(tenant_a, {"tokens": "1"}, lease="not-a-uuid")
    _ship_uses(tenant_a, {"tokens": "1"}, lease=12)
    _ship_uses(tenant_a, {"tokens": "1"}, lease=str(uuid.uuid4()))  # no such lease: counted for none
    assert tasks.settle_tenant(tenant_a, now=_due(lease_id, tenant_a)) == 1
    with tenant_context(tenant_a):
        assert GateLease.objects.get(pk=lease_id).used == [2 * UNIT]
    assert _usage(tenant_a)["used"] == "2"


def test_a_holders_return_wins_and_a_late_one_counts_its_excess(tenant_a: Tenant) -> None:
    _budget(tenant_a)
    returned = _grant(tenant_a)
    assert (
        in_tenant(services.give_back_lease, tenant_a, returned, {"tokens": 1}, actor=ACTOR)["state"]
        == "returned"
    )
    settled = _grant(tenant_a)
    _ship_uses(tenant_a, {"tokens": "1"}, lease=str(settled))
    assert tasks.settle_tenant(tenant_a, now=_due(settled, tenant_a)) == 1
    assert _usage(tenant_a)["used"] == "2"
    # The holder was alive after all: its return names 3 used; the 2 beyond the settlement count.
    late = in_tenant(services.give_back_lease, tenant_a, settled, {"tokens": 3}, actor=ACTOR)
    assert late["state"] == "settled" and late["used"] == {"tokens": "3"}
    assert _usage(tenant_a)["used"] == "4"
    again = in_tenant(services.give_back_lease, tenant_a, settled, {"tokens": 3}, actor=ACTOR)
    assert again["used"] == {"tokens": "3"} and _usage(tenant_a)["used"] == "4"


def test_on_redis_the_counters_the_next_decision_reads_agree_with_the_settlement(
    tenant_a: Tenant,
    private_redis: OwnRedis,
) -> None:
    services.set_store(stores.redis_store(private_redis))
    _budget(tenant_a)
    settled = _grant(tenant_a, calls=100)
    _ship_uses(tenant_a, {"tokens": "1"}, {"tokens": "1"}, lease=str(settled))
    assert tasks.settle_tenant(tenant_a, now=_due(settled, tenant_a)) == 1
    late = in_tenant(services.give_back_lease, tenant_a, settled, {"tokens": 5}, actor=ACTOR)
    assert late["used"] == {"tokens": "5"} and _usage(tenant_a)["used"] == "5"

    def ask(amount: int) -> str:
        request = GateRequest(saga_id=f"s-{uuid.uuid4()}", step_id="1", tool="llm.x", args={"amount": amount})
        return str(in_statements(services.evaluate, tenant_a, request, actor=ACTOR)["decision"])

    assert ask(996) == "deny" and ask(995) == "allow" and ask(1) == "deny"  # 5 spent, the rest back


def test_every_tenants_due_leases_are_settled_in_the_sweep_thread_beside_recovery(
    tenant_a: Tenant, tenant_b: Tenant
) -> None:
    for tenant in (tenant_a, tenant_b):
        _budget(tenant)
    due = max(_due(_grant(tenant), tenant) for tenant in (tenant_a, tenant_b))
    assert services.settle_all_expired_leases(now=due) == 2
    assert _outstanding(tenant_a) == [] and _outstanding(tenant_b) == []

    from recovery.tasks import sweep_all

    assert sweeper.passes() == [sweep_all, services.settle_all_expired_leases]


def _use(tenant: Tenant, lease: uuid.UUID, received_at: Any) -> int:
    with tenant_context(tenant):
        return LeaseUse.objects.create(lease_id=lease, debits={"tokens": UNIT}, received_at=received_at).pk


def _uses(tenant: Tenant) -> set[int]:
    with tenant_context(tenant):
        return set(LeaseUse.objects.values_list("pk", flat=True))


def test_a_closed_leases_uses_are_pruned_after_retention_and_an_open_ones_never(
    tenant_a: Tenant, tenant_b: Tenant
) -> None:
    for tenant in (tenant_a, tenant_b):
        _budget(tenant)
    returned, settled, open_ = (_grant(tenant_a) for _ in range(3))
    in_tenant(services.give_back_lease, tenant_a, returned, {"tokens": 1}, actor=ACTOR)
    due = _due(settled, tenant_a)
    with tenant_context(tenant_a):  # `open_` is due only later: its holder is still alive
        GateLease.objects.filter(pk=open_).update(settle_after=due + timedelta(days=9))
    assert tasks.settle_tenant(tenant_a, now=due) == 1
    assert [lease.pk for lease in _outstanding(tenant_a)] == [open_]
    now = due + timedelta(days=3)
    old, recent = now - services.LEASE_USES_KEPT_FOR - timedelta(minutes=1), now - timedelta(minutes=1)
    gone = {_use(tenant_a, returned, old), _use(tenant_a, settled, old), _use(tenant_a, uuid.uuid4(), old)}
    kept = {
        _use(tenant_a, open_, old),
        _use(tenant_a, returned, recent),
        _use(tenant_a, uuid.uuid4(), recent),
    }
    elsewhere = {_use(tenant_b, _grant(tenant_b), old), _use(tenant_b, uuid.uuid4(), old)}

    # One tenant's pass: its rows past retention go, the open lease's and recent ones stay, and
    # the other tenant's rows (as old, as closed) are untouched.
    assert tasks.prune_lease_uses_of(tenant_a, now=now) == len(gone) == 3
    assert _uses(tenant_a) == kept
    assert _uses(tenant_b) == elsewhere
    assert tasks.prune_lease_uses_of(tenant_a, now=now) == 0
    # The open lease's use is still what its settlement counts.
    with tenant_context(tenant_a):
        assert services.lease_shipped_use(GateLease.objects.get(pk=open_)) == [UNIT]
    # The hourly walker: tenant_b's orphan goes, its outstanding lease's use stays.
    assert tasks.prune_old_rows(now=now) == {"denials": 0, "lease_uses": 1}
    assert len(_uses(tenant_b)) == 1 and _uses(tenant_a) == kept
    from django.conf import settings

    assert settings.CELERY_BEAT_SCHEDULE["fleet-prune-old-rows"]["task"] == tasks.prune_old_rows.name


def test_a_prune_pass_is_bounded_by_its_batches(tenant_a: Tenant) -> None:
    _budget(tenant_a)
    lease = _grant(tenant_a)
    in_tenant(services.give_back_lease, tenant_a, lease, {"tokens": 1}, actor=ACTOR)
    now = _due(lease, tenant_a) + timedelta(days=3)
    old = now - timedelta(hours=2)
    made = [_use(tenant_a, lease, old + timedelta(seconds=n)) for n in range(7)]
    hour = timedelta(hours=1)
    with tenant_context(tenant_a):
        assert services.prune_lease_uses(tenant_a, now=now, kept_for=hour, limit=2) == 2
    assert _uses(tenant_a) == set(made[2:])  # oldest first
    assert tasks.prune_lease_uses_of(tenant_a, now=now, kept_for=hour, batch=2, batches=2) == 4
    assert _uses(tenant_a) == {made[6]}  # the rest waits for the next pass
    assert tasks.prune_lease_uses_of(tenant_a, now=now, kept_for=hour, batch=2, batches=2) == 1
    assert _uses(tenant_a) == set()
