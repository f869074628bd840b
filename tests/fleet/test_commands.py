"""halt / resume / quarantine / rebuild_limits from a shell: the same services, recorded as the
operator (`cli:<login>`), refusals named."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from core.scoping import tenant_context
from fleet import services
from fleet.gate import GateRequest
from fleet.stores import RedisStore, marker_key
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.hostile.production import own_redis
from tests.support.chains import server_stream
from tests.support.scoping import in_statements, in_tenant


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def ask(tenant: Tenant, tool: str, saga: str = "s", **args: object) -> dict[str, object]:
    request = GateRequest(saga_id=saga, step_id=f"{tool}-{len(args)}", tool=tool, args=args)
    return in_statements(
        services.evaluate, tenant, request, actor=named_actor("test"), store=services.DatabaseStore()
    )


def test_halt_then_resume_by_scope(tenant_a: Tenant) -> None:
    out = run("halt", "--tenant", "acme", "--scope", "tool:stripe.*", "--reason", "incident", "--ttl", "600")
    assert "halt tool:stripe.* in force for acme until" in out
    assert ask(tenant_a, "stripe.charge")["reason"] == "halted"
    engaged = server_stream(tenant_a)[-1]
    assert engaged["event"] == "KILLSWITCH_ENGAGED" and engaged["actor"].startswith("cli:")
    assert "lifted" in run("resume", "--tenant", "acme", "--scope", "tool:stripe.*")
    assert ask(tenant_a, "stripe.charge")["decision"] == "allow"
    with pytest.raises(CommandError, match="scope: no halt in force"):
        run("resume", "--tenant", "acme", "--scope", "tool:stripe.*")


def test_refusals_name_what_is_wrong(tenant_a: Tenant) -> None:
    with pytest.raises(CommandError, match="scope:"):
        run("halt", "--tenant", "acme", "--scope", "everything", "--reason", "r")
    with pytest.raises(CommandError, match="tenant: no tenant with slug 'nope'"):
        run("halt", "--tenant", "nope", "--scope", "*", "--reason", "r")
    with pytest.raises(CommandError, match="reason:"):
        run("quarantine", "--tenant", "acme", "saga-1", "--reason", " ", "--preemptive")
    with tenant_context(tenant_a):
        assert services.halts_in_force() == []


def test_quarantine_refuses_the_sagas_steps(tenant_a: Tenant) -> None:
    assert "saga-9 of acme is quarantined (preemptively" in run(
        "quarantine", "--tenant", "acme", "saga-9", "--reason", "loops", "--preemptive"
    )
    assert ask(tenant_a, "crm.insert", saga="saga-9")["reason"] == "quarantined"
    assert server_stream(tenant_a)[-1]["event"] == "SAGA_QUARANTINED"


@pytest.fixture
def redis_store(tmp_path: Path) -> Iterator[RedisStore]:
    with own_redis(tmp_path) as server:
        store = RedisStore(redis.Redis.from_url(server.url), services.ledger_since)
        store.fence_ms, store.commit_deadline_ms = 200, 100
        services.set_store(store)
        try:
            yield store
        finally:
            services.set_store(None)


def test_rebuild_limits_rebuilds_from_the_ledger(tenant_a: Tenant, redis_store: RedisStore) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "cap", "tool": "*", "max_total": 10, "window_s": 3600}),
        actor=named_actor("test"),
    )
    first = GateRequest(saga_id="s", step_id="1", tool="x", args={"amount": 8})
    assert in_statements(services.evaluate, tenant_a, first, actor=named_actor("test"))["decision"] == "allow"
    redis_store.client.flushall()
    redis_store.client.set(
        marker_key(services.gate_tag(tenant_a)), "1"
    )  # a store that *looks* ready but lost its counters
    assert "acme: rebuilt" in run("rebuild_limits", "--tenant", "acme")
    second = GateRequest(saga_id="s", step_id="2", tool="x", args={"amount": 3})
    assert (
        in_statements(services.evaluate, tenant_a, second, actor=named_actor("test"))["reason"]
        == "budget_exceeded"
    )
