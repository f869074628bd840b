"""The multi-replica deployment (infra/cluster.sh: nginx, two web replicas, two Celery workers, one
beat, on a Postgres database and a Redis of the test's own) under load from four SDK shippers,
while a web replica is SIGKILLed and restarted, a Celery worker is SIGKILLed while integrations
run and restarted, and beat is restarted. Afterwards every record each shipper was acknowledged
is stored exactly once, in its chain; every checkpoint seen during the run is consistent with the
final one; nothing is left unintegrated; and /readyz through the balancer said "ready" throughout
(the database and Redis never went away: that is the truth it had to tell), while the killed
replica itself answered nothing."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sagaplane as sp
from sagaplane.chain import GENESIS
from sagaplane.merkle import verify_consistency
from sagaplane.shipper import Backoff

from tests.conftest import unavailable
from tests.hostile.production import (
    ROOT,
    as_owner,
    free_port,
    manage,
    own_database,
    own_redis,
    pg_execute,
    production_env,
)

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

CLUSTER = str(ROOT / "infra" / "cluster.sh")
SHIPPERS = 4
DEADLINE = 120.0


def cluster(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    result = subprocess.run(
        ["bash", CLUSTER, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"cluster.sh {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def wait_for(what: str, condition: Any, deadline: float = DEADLINE) -> Any:
    end = time.monotonic() + deadline
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def answers(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return None


def checkpoint(url: str, api_key: str) -> tuple[int, bytes] | None:
    answer = httpx.get(
        f"{url}/api/v1/audit/checkpoint", headers={"Authorization": f"Bearer {api_key}"}, timeout=5
    )
    if answer.status_code != 200:
        return None
    lines = answer.text.splitlines()
    return int(lines[1]), base64.b64decode(lines[2])


class Agent:
    """One agent: a WAL it keeps writing sagas to while its shipper sends them through nginx."""

    def __init__(self, folder: Path, n: int, url: str, api_key: str) -> None:
        self.wal = sp.WAL(folder / f"agent-{n}.wal", fsync=False)
        self.shipper = sp.Shipper(
            self.wal.path, url=url, api_key=api_key, backoff=Backoff(base=0.05, cap=0.5), batch_size=50
        )
        self.wal.subscribe(self.shipper.notify)
        self.stop = threading.Event()
        self.n = n
        self.thread = threading.Thread(target=self._write, daemon=True)

    def _write(self) -> None:
        count = 0
        while not self.stop.is_set():
            count += 1
            saga_id = f"agent{self.n}-saga{count}"
            self.wal.append("SAGA_START", {"saga_id": saga_id, "pid": 1, "lease_ttl": 30.0})
            for step in range(2):
                fields = {"saga_id": saga_id, "step_id": f"{saga_id}-{step}", "tool": "shop.charge"}
                self.wal.append("STEP_INTENT", {**fields, "kwargs": {"amount": step}})
                self.wal.append("STEP_COMMITTED", {**fields, "result": {"ok": True}})
            self.wal.append("SAGA_COMPLETE", {"saga_id": saga_id})
            self.stop.wait(0.03)

    def start(self) -> None:
        self.shipper.start()
        self.thread.start()


def test_faults_under_load_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        unavailable("nginx is not installed (apt-get install nginx)")
    port, base = free_port(), free_port()
    with own_redis(tmp_path) as redis, own_database() as db:
        env = production_env(
            db.url,
            redis.url,
            tmp_path / "data",
            CLUSTER_DIR=str(tmp_path / "cluster"),
            CLUSTER_PORT=str(port),
            WEB_BASE_PORT=str(base),
            WEB_CONCURRENCY="1",
            SECURE_SSL_REDIRECT="false",
            LOG_LEVEL="INFO",
        )
        (tmp_path / "data").mkdir()
        url = f"http://127.0.0.1:{port}"
        cluster({**env, "DATABASE_OWNER_URL": as_owner(db.url)}, "up")
        try:
            manage(
                env,
                "create_tenant",
                "load",
                "--name",
                "Load",
                "--owner-email",
                "owner@load.example",
                "--owner-password",
                "load-owner-password",
            )
            api_key = (
                manage(
                    env, "create_api_key", "--tenant", "load", "--name", "agents", "--scopes", "ingest,read"
                )
                .strip()
                .splitlines()[-1]
            )
            assert "web-1" in cluster(env, "status")

            readiness: list[int | None] = []
            checkpoints: list[tuple[int, bytes]] = []
            watching = threading.Event()

            def watch() -> None:
                while not watching.is_set():
                    readiness.append(answers(f"{url}/readyz"))
                    seen = checkpoint(url, api_key)
                    if seen and (not checkpoints or seen[0] > checkpoints[-1][0]):
                        checkpoints.append(seen)
                    watching.wait(0.2)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            agents = [Agent(tmp_path, n, url, api_key) for n in range(SHIPPERS)]
            for agent in agents:
                agent.start()
            wait_for("records acknowledged", lambda: all(a.shipper.cursor.shipped > 50 for a in agents))

            # (a) a web replica dies (SIGKILL to its whole process group), then comes back.
            cluster(env, "kill", "web-1")
            assert answers(f"http://127.0.0.1:{base}/readyz") is None  # the dead replica answers nothing
            marks = [a.shipper.cursor.shipped for a in agents]
            wait_for(
                "shipping on through the other replica",
                lambda: all(a.shipper.cursor.shipped > m + 20 for a, m in zip(agents, marks, strict=True)),
            )
            cluster(env, "start", "web-1")
            wait_for("web-1 ready again", lambda: answers(f"http://127.0.0.1:{base}/readyz") == 200)

            # (b) a Celery worker dies while integrations run (beat asks every second), then returns.
            before = checkpoints[-1][0] if checkpoints else 0
            cluster(env, "kill", "worker-1")
            wait_for(
                "checkpoints signed by the other worker", lambda: checkpoints and checkpoints[-1][0] > before
            )
            cluster(env, "start", "worker-1")

            # (c) beat restarts: exactly one runs, before and after.
            cluster(env, "restart", "beat")

            # (d) a graceful restart of web-2 under load (SIGTERM: it drains in-flight requests):
            # no client of the balancer sees an error while it goes and comes back.
            access_log = tmp_path / "cluster" / "logs" / "nginx-access.log"
            seen = len(access_log.read_text().splitlines())
            cluster(env, "restart", "web-2")
            wait_for("web-2 ready again", lambda: answers(f"http://127.0.0.1:{base + 1}/readyz") == 200)
            marks = [a.shipper.cursor.shipped for a in agents]
            wait_for(
                "load after the faults",
                lambda: all(a.shipper.cursor.shipped > m + 20 for a, m in zip(agents, marks, strict=True)),
            )
            during = access_log.read_text().splitlines()[seen:]
            statuses = [line.split('"')[2].split()[0] for line in during if line.count('"') >= 2]
            assert statuses and not [s for s in statuses if s.startswith("5")], statuses

            for agent in agents:
                agent.stop.set()
                agent.thread.join(timeout=30)
            for agent in agents:
                assert agent.shipper.flush(DEADLINE), (
                    f"agent {agent.n}: {agent.shipper.state} {agent.shipper.failure}"
                )
                assert agent.shipper.failure is None

            # Everything integrated under one last checkpoint.
            wait_for(
                "the final checkpoint",
                lambda: (
                    (cp := checkpoint(url, api_key))
                    and cp[0] == int(pg_execute(db.owner_url, "SELECT size FROM audit_tenantlog")[0][0])
                ),
            )
            watching.set()
            watcher.join(timeout=30)
            final = checkpoint(url, api_key)
            assert final is not None

            # Every checkpoint seen during the run is a prefix of the final tree.
            assert len(checkpoints) >= 3
            headers = {"Authorization": f"Bearer {api_key}"}
            with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
                for size, root in checkpoints:
                    if size == final[0]:
                        assert root == final[1]
                        continue
                    proof = client.get(
                        "/api/v1/audit/proofs/consistency", params={"first": size, "second": final[0]}
                    )
                    assert proof.status_code == 200, proof.text
                    hashes = [base64.b64decode(h) for h in proof.json()["hashes"]]
                    verify_consistency(size, final[0], hashes, root, final[1])
        finally:
            for agent in locals().get("agents", []):
                agent.stop.set()
                agent.shipper.close(timeout=5)
                agent.wal.close()
            cluster(env, "down", timeout=180)

        # Every acknowledged record stored exactly once, in its chain.
        for agent in agents:
            sent = [json.loads(line) for line in agent.wal.path.read_text().splitlines() if line.strip()]
            rows = pg_execute(
                db.owner_url,
                "SELECT r.position, r.ph, r.h FROM audit_record r JOIN audit_stream s ON s.id = r.stream_id "
                "WHERE s.stream_id = %s ORDER BY r.position",
                (agent.wal.stream_id,),
            )
            assert len(rows) == len(sent) == agent.shipper.cursor.shipped
            assert [position for position, _, _ in rows] == list(range(1, len(rows) + 1))
            assert rows[0][1] == GENESIS and all(rows[i][1] == rows[i - 1][2] for i in range(1, len(rows)))
            assert [h for _, _, h in rows] == [record["_h"] for record in sent]

        # /readyz through the balancer told the truth: every answer it gave was "ready" (a probe
        # the loaded machine left unanswered within its timeout is no answer, not a lie; a 5xx
        # or a "not ready" from the balancer is).
        answered = [status for status in readiness if status is not None]
        assert answered and all(status == 200 for status in answered), sorted(set(map(str, readiness)))
