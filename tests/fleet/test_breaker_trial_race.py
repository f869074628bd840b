"""A half-open breaker lets exactly one trial call through fleet-wide: 64 gate clients in 4
processes released together after the cool-down, on Postgres with either store (the lean path on
Redis claims the trial in its own short transaction): one is allowed, every other is refused
`circuit_open`, and the breaker's history holds one open → half-open transition."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from core.scoping import tenant_context
from fleet import services
from fleet.models import BreakerState, BreakerTransition, CircuitBreaker
from tenants import founding
from tenants.actors import named_actor
from tests.fleet.concurrency import PROCESSES, THREADS, child_env, run_clients, running_database_url
from tests.hostile.production import own_redis
from tests.support.scoping import in_tenant


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("store", ["redis", "database"])
def test_half_open_admits_exactly_one_trial_across_4_processes(
    transactional_db: None, tmp_path: Path, store: str
) -> None:
    tenant = founding.create_tenant(
        "trial-race", "Trial race", "owner@trial.example", actor=named_actor("test")
    )
    fields = {
        "name": "vendor down",
        "tool": "vendor.*",
        "consecutive_failures": 1,
        "failure_rate": 1,
        "min_volume": 1,
        "window_s": 60,
        "cool_down_s": 60,
    }
    row = in_tenant(
        services.create_breaker, tenant, services.BreakerCreate.parse(fields), actor=named_actor("test")
    )
    assert in_tenant(services.trip, tenant, services.breaker_spec(row), "opened by the test")
    with tenant_context(tenant):  # the cool-down is over
        CircuitBreaker.objects.filter(pk=row.pk).update(opened_at=timezone.now() - timedelta(seconds=61))
    config: dict[str, Any] = {
        "tenant": "trial-race",
        "threads": THREADS,
        "calls": 1,
        "amount": 1,
        "tool": "vendor.pay",
    }
    env = child_env(DATABASE_URL=running_database_url(), SAGAPLANE_GATE_STORE="database")
    if store == "redis":
        with own_redis(tmp_path) as server:
            config["redis_url"] = server.url
            env["REDIS_URL"] = server.url
            answers = run_clients(env, config)
    else:
        answers = run_clients(env, config)
    assert len(answers) == PROCESSES * THREADS
    allowed = [a for a in answers if a["decision"] == "allow"]
    refused = {a.get("reason") for a in answers if a["decision"] != "allow"}
    assert len(allowed) == 1, answers[:5]
    assert refused == {"circuit_open"}
    with tenant_context(tenant):
        assert CircuitBreaker.objects.get(pk=row.pk).state == BreakerState.HALF_OPEN
        moves = list(
            BreakerTransition.objects.filter(breaker_id=row.pk).values_list("old_state", "new_state")
        )
    assert moves == [("closed", "open"), ("open", "half_open")]
