"""The multi-replica deployment (infra/cluster.sh: nginx, two web replicas, two Celery workers, one
beat, on a Postgres database and a Redis of the test's own) under load from four SDK shippers,
while a web replica is SIGKILLed and restarted, a Celery worker is SIGKILLed while integrations
run and restarted, and beat is restarted. Afterwards every record each shipper was acknowledged
is stored exactly once, in its chain; every checkpoint seen during the run is consistent with the
final one; nothing is left unintegrated; and /readyz through the balancer said "ready" throughout
(the database and Redis never went away: that is the truth it had to tell), while the killed
replica itself answered nothing. A SIGTERMed replica answers the slow request it holds while the
balancer sends new ones to the other; and the same cluster with each process in its own network
namespace (where `ip netns` is permitted) stores what it is sent and leaves nothing behind."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import sagaplane as sp
from sagaplane.chain import GENESIS
from sagaplane.merkle import verify_consistency
from sagaplane.shipper import Backoff

from tests.hostile.production import ROOT, as_owner, manage, own_database, own_redis, pg_execute
from tests.support.ports import free_port
from tests.support.prerequisites import unavailable
from tests.support.production_env import production_env
from tests.support.waiting import wait_until

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


def answers(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return None


def checkpoint(url: str, api_key: str) -> tuple[int, bytes] | None:
    """The latest signed checkpoint, or None when there is no answer yet: on a loaded machine a
    request may outlast its timeout, which is no answer (callers wait for one), not a failure."""
    try:
        answer = httpx.get(
            f"{url}/api/v1/audit/checkpoint", headers={"Authorization": f"Bearer {api_key}"}, timeout=15
        )
    except httpx.TimeoutException:
        return None
    if answer.status_code != 200:
        return None
    lines = answer.text.splitlines()
    return int(lines[1]), base64.b64decode(lines[2])


def in_flight(sock: socket.socket, server_port: int, netns: str | None) -> bool:
    """Whether the replica has read the request sent on `sock` (its end of the connection holds no
    unread bytes): from then on the request is in its hands, not in a listen backlog."""
    client_port = sock.getsockname()[1]
    command = ["ss", "-Htn", "state", "established", "(", "sport", "=", f":{server_port}"]
    command += ["and", "dport", "=", f":{client_port}", ")"]
    if netns:
        command = ["ip", "netns", "exec", netns, *command]
    fields = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.split()
    return bool(fields) and fields[0] == "0"


def sweep_lag(url: str) -> float | None:
    """The recovery sweep's lag by /readyz, when it is below two seconds (a pass just ran)."""
    try:
        detail = httpx.get(f"{url}/readyz", timeout=30).json().get("detail", {}).get("recovery_sweep", {})
    except (httpx.HTTPError, ValueError):
        return None
    lag = detail.get("lag_s")
    return lag if detail.get("status") == "ok" and lag is not None and lag < 2 else None


def drains_on_sigterm(
    env: dict[str, str], url: str, api_key: str, access_log: Path, netns: str | None = None
) -> None:
    """SIGTERM to web-1 while a slow request (a 12 s claim long-poll) is in its hands: the request
    is answered in full after the signal, and meanwhile the balancer sends new requests to web-2."""
    replica = cluster(env, "url", "web-1").strip()
    other = cluster(env, "url", "web-2").strip().removeprefix("http://")
    host, port = replica.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"handlers": ["nobody.registers.this"], "wait": 12}).encode()
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(
        b"POST /api/v1/recovery/claim HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Authorization: Bearer {api_key}\r\n".encode()
        + b"Content-Type: application/json\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    wait_until(
        lambda: in_flight(sock, int(port), netns), "the slow request in web-1's hands", deadline=30, every=0.2
    )
    stopping = threading.Thread(target=cluster, args=(env, "stop", "web-1"))
    terminated_at = time.monotonic()
    stopping.start()
    # web-1 stops taking connections at once ...
    wait_until(
        lambda: answers(f"{replica}/readyz") is None, "web-1 to close its listener", deadline=30, every=0.2
    )
    seen = len(access_log.read_text().splitlines())
    # ... and the balancer answers from web-2 while web-1 finishes the slow request.
    for _ in range(5):
        status = httpx.get(f"{url}/readyz", timeout=60).status_code
        assert status == 200, (status, nginx_errors(env))

    def during_log() -> list[str]:
        return [line for line in access_log.read_text().splitlines()[seen:] if '"GET /readyz ' in line]

    # nginx logs a request once it is finalised, which may be just after its client has the
    # answer: wait (bounded) for the five lines rather than read the log at once.
    wait_until(
        lambda: len(during_log()) >= 5, "the balancer to log the five requests", deadline=30, every=0.2
    )
    during = during_log()
    upstreams = [re.search(r'upstream="([^"]*)"', line) for line in during]
    # (a retried request lists both: "web-1's address, web-2's address")
    assert len(upstreams) >= 5 and all(m and m.group(1).endswith(other) for m in upstreams), during
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    answered_at = time.monotonic()
    sock.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert answer.endswith(b'{"job":null}'), answer[-200:]
    assert answered_at > terminated_at
    stopping.join(timeout=90)
    assert not stopping.is_alive()
    assert answers(f"{replica}/readyz") is None
    assert drained_in_log(Path(env["CLUSTER_DIR"]) / "logs" / "web-1.log")
    cluster(env, "start", "web-1")
    wait_until(lambda: answers(f"{replica}/readyz") == 200, "web-1 ready again", deadline=DEADLINE, every=0.2)


def nginx_errors(env: dict[str, str]) -> list[str]:
    """The balancer's own account of a failure (why it gave up on a replica), for the report."""
    return (Path(env["CLUSTER_DIR"]) / "logs" / "nginx-error.log").read_text().splitlines()[-20:]


def drained_in_log(path: Path) -> bool:
    """The replica's own log: after SIGTERM it waited for open connections, and answered the
    long-poll (200) before it exited."""
    log = path.read_text()
    waiting = log.rfind("Waiting for connections to close")
    if waiting < 0:
        return False
    for line in log[waiting:].splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("http_route") == "recovery-claim" and entry.get("http_status") == 200:
            return True
    return False


class Agent:
    """One agent: a WAL it keeps writing sagas to while its shipper sends them through nginx."""

    def __init__(self, folder: Path, n: int, url: str, api_key: str) -> None:
        # One segment for the whole run (the default rolls over at 4 MiB, which a quiet machine
        # reaches): the check below reads back every record the agent wrote from this one file.
        self.wal = sp.WAL(folder / f"agent-{n}.wal", fsync=False, segment_bytes=1 << 30)
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
                    env,
                    "create_api_key",
                    "--tenant",
                    "load",
                    "--name",
                    "agents",
                    "--scopes",
                    "ingest,read,recovery",
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
            wait_until(
                lambda: all(a.shipper.cursor.shipped > 50 for a in agents),
                "records acknowledged",
                deadline=DEADLINE,
                every=0.2,
            )

            # (a) a web replica dies (SIGKILL to its whole process group), then comes back.
            cluster(env, "kill", "web-1")
            assert answers(f"http://127.0.0.1:{base}/readyz") is None  # the dead replica answers nothing
            marks = [a.shipper.cursor.shipped for a in agents]
            wait_until(
                lambda: all(a.shipper.cursor.shipped > m + 20 for a, m in zip(agents, marks, strict=True)),
                "shipping on through the other replica",
                deadline=DEADLINE,
                every=0.2,
            )
            cluster(env, "start", "web-1")
            wait_until(
                lambda: answers(f"http://127.0.0.1:{base}/readyz") == 200,
                "web-1 ready again",
                deadline=DEADLINE,
                every=0.2,
            )

            # (b) a Celery worker dies while integrations run (beat asks every second), then returns.
            before = checkpoints[-1][0] if checkpoints else 0
            cluster(env, "kill", "worker-1")
            wait_until(
                lambda: checkpoints and checkpoints[-1][0] > before,
                "checkpoints signed by the other worker",
                deadline=DEADLINE,
                every=0.2,
            )
            cluster(env, "start", "worker-1")

            # (c) beat restarts: exactly one runs, before and after; its recovery sweeper thread
            # (the sweep is no queued message) runs passes in the new beat process.
            cluster(env, "restart", "beat")
            wait_until(
                lambda: sweep_lag(url) is not None,
                "the restarted beat's recovery sweep",
                deadline=DEADLINE,
                every=0.2,
            )

            # (d) a graceful restart of web-2 under load (SIGTERM: it drains in-flight requests):
            # no client of the balancer sees an error while it goes and comes back.
            access_log = tmp_path / "cluster" / "logs" / "nginx-access.log"
            seen = len(access_log.read_text().splitlines())
            cluster(env, "restart", "web-2")
            wait_until(
                lambda: answers(f"http://127.0.0.1:{base + 1}/readyz") == 200,
                "web-2 ready again",
                deadline=DEADLINE,
                every=0.2,
            )
            marks = [a.shipper.cursor.shipped for a in agents]
            wait_until(
                lambda: all(a.shipper.cursor.shipped > m + 20 for a, m in zip(agents, marks, strict=True)),
                "load after the faults",
                deadline=DEADLINE,
                every=0.2,
            )
            during = access_log.read_text().splitlines()[seen:]
            statuses = [line.split('"')[2].split()[0] for line in during if line.count('"') >= 2]
            assert statuses and not [s for s in statuses if s.startswith("5")], (statuses, nginx_errors(env))

            # (e) SIGTERM to web-1 while a slow request is in its hands: answered in full, while
            # the balancer sends the rest to web-2.
            drains_on_sigterm(env, url, api_key, access_log)

            for agent in agents:
                agent.stop.set()
                agent.thread.join(timeout=30)
            for agent in agents:
                assert agent.shipper.flush(DEADLINE), (
                    f"agent {agent.n}: {agent.shipper.state} {agent.shipper.failure}"
                )
                assert agent.shipper.failure is None

            # Everything integrated under one last checkpoint.
            wait_until(
                lambda: (
                    (cp := checkpoint(url, api_key))
                    and cp[0] == int(pg_execute(db.owner_url, "SELECT size FROM audit_tenantlog")[0][0])
                ),
                "the final checkpoint",
                deadline=DEADLINE,
                every=0.2,
            )
            watching.set()
            watcher.join(timeout=30)
            final = wait_until(
                lambda: checkpoint(url, api_key), "the final checkpoint again", deadline=DEADLINE, every=0.2
            )

            # Every checkpoint seen during the run is a prefix of the final tree.
            assert len(checkpoints) >= 3
            headers = {"Authorization": f"Bearer {api_key}"}
            with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
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


def netns_permitted() -> str:
    """Why network namespaces cannot be used here ("" when they can): a throwaway one is made."""
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    if shutil.which("socat") is None:
        return "socat is not installed (apt-get install socat)"
    probe = f"sagaplane-probe-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return ""


def net_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def leftovers(port: int, net: str) -> list[str]:
    """This cluster's namespaces, veths and forwarders still on the machine."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    listeners = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
    return (
        [line for line in namespaces.splitlines() if line.startswith(f"sagaplane-{port}-")]
        + [line for line in links.splitlines() if re.search(rf": sp{port}[hn]\d+", line)]
        + [line for line in listeners.splitlines() if f" {net}." in line]
    )


def test_replicas_in_their_own_network_namespaces(tmp_path: Path) -> None:
    """SAGAPLANE_CLUSTER_NETNS=1: each web replica, worker and beat in its own network namespace,
    reached by nginx over a veth and reaching Postgres and Redis through the forwarders on the host
    end of its own veth. Records ingested through the balancer are stored; a replica drains a slow
    request on SIGTERM while the balancer sends the rest to the other; and after a crash (processes
    SIGKILLed, the pid files lost) `down` still removes every namespace, veth and forwarder."""
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        unavailable("nginx is not installed (apt-get install nginx)")
    why_not = netns_permitted()
    if why_not:
        if os.environ.get("CI") == "true" and os.geteuid() == 0:
            pytest.fail(why_not + " — under CI=true as root this is a failure, not a skip")
        pytest.skip(why_not)
    port, base = free_port(), free_port()
    net = f"10.{port >> 8}.{port & 255}"
    with own_redis(tmp_path) as redis, own_database() as db:
        env = production_env(
            db.url,
            redis.url,
            tmp_path / "data",
            CLUSTER_DIR=str(tmp_path / "cluster"),
            CLUSTER_PORT=str(port),
            WEB_BASE_PORT=str(base),
            WEB_CONCURRENCY="1",
            CELERY_WORKERS="1",
            SECURE_SSL_REDIRECT="false",
            LOG_LEVEL="INFO",
            SAGAPLANE_CLUSTER_NETNS="1",
        )
        (tmp_path / "data").mkdir()
        url = f"http://127.0.0.1:{port}"
        pids = tmp_path / "cluster" / "pids"
        try:
            assert "own network namespace" in cluster({**env, "DATABASE_OWNER_URL": as_owner(db.url)}, "up")
            manage(
                env,
                "create_tenant",
                "netns",
                "--name",
                "Netns",
                "--owner-email",
                "owner@netns.example",
                "--owner-password",
                "netns-owner-password",
            )
            api_key = (
                manage(
                    env, "create_api_key", "--tenant", "netns", "--name", "a", "--scopes", "ingest,recovery"
                )
                .strip()
                .splitlines()[-1]
            )

            # Each process in a namespace of its own; nginx in the host's (this test's).
            names = ["web-1", "web-2", "worker-1", "beat"]
            spaces = {name: net_namespace(int((pids / f"{name}.pid").read_text())) for name in names}
            host = net_namespace(os.getpid())
            assert len(set(spaces.values())) == len(names) and host not in spaces.values(), spaces
            assert net_namespace(int((pids / "nginx.pid").read_text())) == host
            for name in names:
                assert f"sagaplane-{port}-{name}" in cluster(env, "status")
            # A replica listens only in its namespace: not on the host's loopback.
            assert answers(f"http://127.0.0.1:{base}/readyz") is None
            assert cluster(env, "url", "web-1").strip() == f"http://{net}.6:{base}"

            # Records through the balancer reach Postgres, over the replicas' veths.
            def crossed() -> int:
                return sum(
                    int(Path(f"/sys/class/net/sp{port}h{slot}/statistics/rx_bytes").read_text())
                    for slot in (1, 2)
                )

            before = crossed()
            wal = sp.WAL(tmp_path / "agent.wal", fsync=False)
            shipper = sp.Shipper(wal.path, url=url, api_key=api_key, backoff=Backoff(base=0.05, cap=0.5))
            for n in range(20):
                wal.append("SAGA_START", {"saga_id": f"ns-{n}", "pid": 1, "lease_ttl": 30.0})
                wal.append("SAGA_COMPLETE", {"saga_id": f"ns-{n}"})
            shipper.start()
            try:
                assert shipper.flush(DEADLINE), f"{shipper.state} {shipper.failure}"
            finally:
                shipper.close(timeout=5)
                wal.close()
            stored = pg_execute(
                db.owner_url,
                "SELECT count(*) FROM audit_record r JOIN audit_stream s ON s.id = r.stream_id "
                "WHERE s.stream_id = %s",
                (wal.stream_id,),
            )
            assert stored[0][0] == 40
            assert crossed() > before

            drains_on_sigterm(
                env,
                url,
                api_key,
                tmp_path / "cluster" / "logs" / "nginx-access.log",
                f"sagaplane-{port}-web-1",
            )

            # A crash: nginx and beat SIGKILLed, the pid files lost; replicas, worker and forwarders
            # left running. `down` finds them all by name and address.
            running = [int(p.read_text()) for p in pids.glob("*.pid")]
            for name in ("nginx", "beat"):
                os.killpg(int((pids / f"{name}.pid").read_text()), 9)
            shutil.rmtree(pids)
            assert leftovers(port, net)
        finally:
            cluster(env, "down", timeout=180)
        assert leftovers(port, net) == []
        gone = wait_until(
            lambda: all(not Path(f"/proc/{pid}").exists() or _zombie(pid) for pid in running),
            "every process of the cluster to exit",
            deadline=30,
            every=0.2,
        )
        assert gone


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True
