"""The gate's Lua on a real 3-node Redis Cluster started here: every key of a tenant carries the
`{t<id>}` hash tag, so the one script runs unchanged, atomically, in one slot — and the 64-client
overspend test holds there too."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from fleet import services
from fleet.gate import GateRequest
from fleet.stores import RedisStore
from tenants import founding
from tenants.actors import named_actor
from tests.fleet.concurrency import (
    AMOUNT,
    CAP,
    THREADS,
    assert_exactly_fifty,
    child_env,
    run_clients,
    running_database_url,
)
from tests.support.ports import free_port
from tests.support.probes import redis_answers
from tests.support.scoping import in_statements, in_tenant
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
DEADLINE = 60


def _cluster_port() -> int:
    """A free port whose cluster-bus twin (port + 10000) is a valid, free port too."""
    while True:
        port = free_port()
        if port + 10_000 > 65_535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[str]:
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if binary is None or cli is None:
        pytest.fail("redis-server and redis-cli are needed for the cluster test")
    ports = [_cluster_port() for _ in range(3)]
    nodes = []
    try:
        for port in ports:
            folder = tmp_path / f"node-{port}"
            folder.mkdir()
            nodes.append(
                subprocess.Popen(
                    [
                        binary,
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ],
                    cwd=folder,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for port, node in zip(ports, nodes, strict=True):
            wait_until(
                lambda port=port: redis_answers(f"redis://127.0.0.1:{port}/0"),
                f"cluster node on port {port} to start",
                deadline=DEADLINE,
                alive=node,
            )
        create = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *[f"127.0.0.1:{p}" for p in ports],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
        assert create.returncode == 0, create.stdout[-2000:] + create.stderr[-2000:]
        # The cluster is usable once every node agrees the state is ok (redis-cli --cluster check).
        check = subprocess.run(
            [cli, "--cluster", "check", f"127.0.0.1:{ports[0]}"],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
        assert "[OK] All 16384 slots covered" in check.stdout, check.stdout[-2000:]
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for node in nodes:
            node.kill()
            node.wait(timeout=30)


def _cluster_client(url: str) -> RedisCluster:
    return RedisCluster.from_url(url, socket_timeout=5)


def test_the_gate_script_runs_unchanged_on_a_cluster(tenant_a: object, redis_cluster: str) -> None:
    store = RedisStore(_cluster_client(redis_cluster), services.ledger_since)
    store.fence_ms, store.commit_deadline_ms = 200, 100
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "cap", "tool": "*", "max_total": 10, "window_s": 3600}),
        actor=named_actor("test"),
    )
    in_tenant(
        services.create_rate_limit,
        tenant_a,
        services.RateLimitCreate.parse(
            {"name": "r", "tool": "*", "max_calls": 100, "window_s": 60, "per": ["agent"]}
        ),
        actor=named_actor("test"),
    )
    answers = [
        in_statements(
            services.evaluate,
            tenant_a,
            GateRequest(saga_id="s", step_id=str(n), tool="x", args={"amount": 4}, agent=f"a{n % 3}"),
            actor=named_actor("test"),
            store=store,
        )
        for n in range(4)
    ]
    assert [a["decision"] for a in answers] == ["allow", "allow", "deny", "deny"]
    assert answers[2]["reason"] == "budget_exceeded"


def test_64_clients_in_4_processes_never_overspend_on_a_cluster(
    transactional_db: None, redis_cluster: str
) -> None:
    founding.create_tenant("gate-cluster", "Gate cluster", "owner@cluster.example", actor=named_actor("test"))
    from tenants.models import Tenant

    tenant = Tenant.objects.get(slug="gate-cluster")
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse(
            {"name": "fleet", "tool": "stripe.*", "max_total": CAP, "window_s": 86400}
        ),
        actor=named_actor("test"),
    )
    env = child_env(DATABASE_URL=running_database_url(), SAGAPLANE_GATE_STORE="database")
    config = {
        "tenant": "gate-cluster",
        "threads": THREADS,
        "calls": 1,
        "amount": AMOUNT,
        "redis_cluster_url": redis_cluster,
    }
    assert_exactly_fifty(run_clients(env, config))
