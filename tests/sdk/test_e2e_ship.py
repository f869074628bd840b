"""The SDK against the REAL control plane (audit ingest, saga projection), not the test double.

Most tests use pytest-django's `live_server` (threaded, same test database). The outage test runs
the control plane as a subprocess (uvicorn) that it kills with SIGKILL and restarts on the same
port. Nothing here sleeps to synchronise: children signal over pipes, servers announce readiness
on their log, and the shipper's condition variable says when it is backing off or caught up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from agent_saga import integrity
from django.conf import settings
from django.db import connection
from sagaplane.chain import verify_chain
from sagaplane.shipper import ShipperState
from sagaplane_testkit import CRASHING_AGENT_PRELUDE, read_wal

from core.scoping import tenant_context
from tenants import founding
from tenants import services as tenant_services
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tests.support.ports import free_port
from tests.support.scoping import in_tenant

REPO = Path(__file__).resolve().parents[2]

# -- the agent's tools ---------------------------------------------------------------------------

LEDGER: dict[str, Any] = {"stock": 100, "charges": set(), "refund_fails": False}


@sp.compensator("e2e.release")
def release(qty: int) -> None:
    LEDGER["stock"] += qty


@sp.compensator("e2e.refund")
def refund(charge_id: str, idempotency_key: str) -> None:
    if LEDGER["refund_fails"]:
        raise ConnectionError(f"provider down refunding {charge_id}")
    LEDGER["charges"].discard(charge_id)


@sp.tool(semantics=sp.REVERSIBLE, compensate=lambda r: sp.undo("e2e.release", qty=r))
def reserve(qty: int) -> int:
    LEDGER["stock"] -= qty
    return qty


@sp.tool(semantics=sp.COMPENSABLE, compensate=lambda r: sp.undo("e2e.refund", charge_id=r["id"]))
def charge(amount: int) -> dict[str, Any]:
    charge_id = f"ch_{amount}_{len(LEDGER['charges'])}"
    LEDGER["charges"].add(charge_id)
    return {"id": charge_id}


@sp.tool(semantics=sp.COMPENSABLE, compensate=lambda r: None)
def ship_parcel(fail: bool) -> str:
    if fail:
        raise RuntimeError("carrier API returned 502")
    return "parcel-1"


def run_sagas(wal: sp.WAL, *, tag: str) -> dict[str, str]:
    """Three sagas: one completes, one rolls back cleanly, one rolls back only partly.
    Returns {expected server status: saga_id}."""
    out = {}
    with sp.saga(name=f"{tag}-ok", wal=wal, retry_delay=0) as s:
        reserve(2)
        charge(10)
    out["completed"] = s.saga_id
    with (
        pytest.raises(sp.SagaAborted) as aborted,
        sp.saga(name=f"{tag}-rollback", wal=wal, retry_delay=0) as s,
    ):
        reserve(1)
        charge(20)
        raise RuntimeError("model changed its mind")
    assert aborted.value.report.clean
    out["rolled_back"] = s.saga_id
    LEDGER["refund_fails"] = True
    try:
        with (
            pytest.raises(sp.SagaAborted) as aborted,
            sp.saga(name=f"{tag}-partial", wal=wal, retry_delay=0, max_attempts=2) as s,
        ):
            charge(30)
            ship_parcel(True)
        assert not aborted.value.report.clean
    finally:
        LEDGER["refund_fails"] = False
    out["rollback_partial"] = s.saga_id
    return out


# -- talking to the server -----------------------------------------------------------------------


def stream_of(client: sp.Client, stream_id: str) -> dict[str, Any]:
    resp = client.stream(stream_id)
    assert resp.status == 200, (resp.status, resp.body)
    return resp.body


def saga_of(client: sp.Client, saga_id: str) -> dict[str, Any]:
    resp = client.get(f"/api/v1/sagas/{urllib.parse.quote(saga_id, safe='')}")
    assert resp.status == 200, (resp.status, resp.body)
    return resp.body


def assert_server_holds_exactly(client: sp.Client, stream_id: str, records: list[dict[str, Any]]) -> None:
    """The stream's head is the WAL's head and its length the WAL's length; each saga's records
    on the server are the WAL's records of that saga, once each, in WAL order."""
    stream = stream_of(client, stream_id)
    assert stream["head"]["hash"] == records[-1]["_h"]
    assert stream["length"] == len(records)
    by_saga: dict[str, list[str]] = {}
    for rec in records:
        if rec.get("saga_id"):
            by_saga.setdefault(rec["saga_id"], []).append(rec["_h"])
    leaves: list[tuple[int, str]] = []
    for saga_id, hashes in by_saga.items():
        held = saga_of(client, saga_id)["records"]
        assert [r["record"]["_h"] for r in held] == hashes, saga_id
        assert {r["stream"] for r in held} == {stream_id}
        leaves += [(r["leaf_index"], r["record"]["_h"]) for r in held]
    wal_order = [r["_h"] for r in records if r.get("saga_id")]
    assert [h for _, h in sorted(leaves)] == wal_order  # the log holds them in WAL order


def fast_shipper(wal: sp.WAL, url: str, key: str, **kw: Any) -> sp.Shipper:
    shipper = sp.Shipper(
        wal.path,
        stream_id=wal.stream_id,
        url=url,
        api_key=key,
        backoff=sp.Backoff(base=0.02, cap=0.3),
        **kw,
    )
    shipper.batches = []  # type: ignore[attr-defined]
    shipper.on_batch = lambda n, _response: shipper.batches.append(n)  # type: ignore[attr-defined]
    wal.subscribe(shipper.notify)
    return shipper.start()


# -- 1. a real saga, shipped and projected --------------------------------------------------------


def test_shipped_sagas_are_held_once_verified_and_projected(
    transactional_db: None, live_server: Any, alice: Any, tmp_path: Path
) -> None:
    wal = sp.WAL(tmp_path / "agent.wal")
    shipper = fast_shipper(wal, live_server.url, alice.api_key, batch_size=4)  # several batches
    try:
        ids = run_sagas(wal, tag="e2e")
        assert shipper.flush(60), shipper.failure
    finally:
        shipper.close()
        wal.close()
    records = read_wal(wal.path)
    assert verify_chain(records).intact and integrity.verify(records).intact
    assert shipper.accepted == len(records) and shipper.duplicates == 0

    client = sp.Client(live_server.url, alice.api_key)
    assert_server_holds_exactly(client, wal.stream_id, records)

    for status, saga_id in ids.items():
        assert saga_of(client, saga_id)["saga"]["status"] == status
    rolled = saga_of(client, ids["rolled_back"])
    assert [(s["tool"], s["semantics"], s["status"]) for s in rolled["steps"]] == [
        ("reserve", "REVERSIBLE", "compensated"),
        ("charge", "COMPENSABLE", "compensated"),
    ]
    assert rolled["steps"][1]["compensation"]["handler"] == "e2e.refund"
    partial = saga_of(client, ids["rollback_partial"])
    assert [s["status"] for s in partial["steps"]] == ["compensation_failed", "orphaned"]

    # Forget the cursor: the server's head says everything is there, so nothing is sent again.
    shipper.cursor_file.unlink()
    again = sp.Shipper(wal.path, url=live_server.url, api_key=alice.api_key, batch_size=7)
    assert again.cursor.offset == 0
    assert again.run_until_caught_up() == 0 and again.cursor.offset == wal.path.stat().st_size
    assert again.accepted == 0 and again.duplicates == 0
    assert_server_holds_exactly(client, wal.stream_id, records)


# -- 2. an agent-saga WAL through `sagaplane ship` ------------------------------------------------

AGENT_SAGA_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from agent_saga import saga_scope, tool, compensator, SagaAborted
    from agent_saga.context import SagaContext
    from agent_saga.semantics import ActionSemantics as S, Compensation
    from agent_saga.wal import FileWAL

    @compensator("as.refund")
    def refund(charge_id, idempotency_key=None):
        pass

    @tool(semantics=S.COMPENSABLE, compensate=lambda r: Compensation(
        fn=refund, kwargs={"charge_id": r["id"]}, handler="as.refund", description="refund"))
    def pay(amount):
        return {"id": f"ch_{amount}"}

    @tool(semantics=S.COMPENSABLE, compensate=lambda r: Compensation(fn=lambda: None))
    def closure_only(x):
        return x

    async def main(path):
        wal = FileWAL(path); await wal.start()
        async with saga_scope(name="clean", wal=wal):
            await pay(amount=10)
        try:
            async with saga_scope(name="rolled", wal=wal):
                await pay(amount=20); await closure_only(x=1)
                raise RuntimeError("boom")
        except SagaAborted as e:
            assert e.report.clean
        async def one(i):
            async with saga_scope(name=f"c{i}", wal=wal):
                await pay(amount=i)
        await asyncio.gather(*(one(i) for i in range(5)))
        await wal.close()
        wal = FileWAL(path); await wal.start()          # a restarted writer: seq restarts at 1
        async with saga_scope(name="after-restart", wal=wal):
            await pay(amount=99)
        await wal.close()

    asyncio.run(main(sys.argv[1]))
    """
)


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AGENT_SAGA_WAL_KEY", "SAGAPLANE_URL", "SAGAPLANE_API_KEY", "DATABASE_OWNER_URL")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "sdk"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def test_agent_saga_wal_ships_with_the_cli_and_verifies_on_the_server(
    transactional_db: None, live_server: Any, alice: Any, tmp_path: Path
) -> None:
    wal = tmp_path / "agent-saga.wal"
    script = tmp_path / "writer.py"
    script.write_text(AGENT_SAGA_WRITER)
    subprocess.run([sys.executable, str(script), str(wal)], env=clean_env(), check=True, timeout=120)
    records = read_wal(wal)
    assert integrity.verify(records).intact
    seqs = [r["seq"] for r in records]
    assert seqs[-4:] == [1, 2, 3, 4] and seqs[0] == 1  # the restart is in the file

    env = clean_env(SAGAPLANE_URL=live_server.url, SAGAPLANE_API_KEY=alice.api_key)
    cli = [sys.executable, "-m", "sagaplane", "ship", str(wal), "--batch-size", "9"]
    out = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"shipped {len(records)} record(s)" in out.stdout and f"{len(records)} accepted" in out.stdout
    stream_id = json.loads((tmp_path / "agent-saga.wal.meta.json").read_text())["stream_id"]

    client = sp.Client(live_server.url, alice.api_key)
    assert_server_holds_exactly(client, stream_id, records)
    names = {r["saga_id"]: r.get("name") for r in records if r["event"] == "SAGA_START"}
    statuses = {names[sid]: saga_of(client, sid)["saga"]["status"] for sid in names}
    assert statuses["rolled"] == "rolled_back"
    assert statuses["clean"] == statuses["after-restart"] == "completed"
    assert all(statuses[f"c{i}"] == "completed" for i in range(5))

    again = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "shipped 0 record(s)" in again.stdout, again.stderr
    assert stream_of(client, stream_id)["length"] == len(records)


# -- 3. SIGKILL after the effect, before the commit record -----------------------------------------

CRASHING_AGENT = CRASHING_AGENT_PRELUDE + textwrap.dedent(
    """
    # Ships to SAGAPLANE_URL in the background. No gate: its long-poll of the fleet status, cut by
    # the SIGKILL, would keep a live-server thread polling past the test's end, into its teardown
    # (a poll's transaction deadlocked with the TRUNCATE once, under load).
    runtime = sp.configure(wal_path, gate=False)
    with sp.saga(name="first"):
        ok(1)
    assert runtime.flush(60), runtime.shipper.failure
    os.write(signal_fd, b"F")                 # the first saga is on the server
    with sp.saga(name="crashing"):
        ok(2)
        doomed(3)
    """
)


def test_sigkilled_agent_loses_nothing_and_a_new_process_ships_the_rest_once(
    transactional_db: None, live_server: Any, alice: Any, tmp_path: Path
) -> None:
    wal_path, effect = tmp_path / "agent.wal", tmp_path / "effect.txt"
    script = tmp_path / "agent.py"
    script.write_text(CRASHING_AGENT)
    env = clean_env(SAGAPLANE_URL=live_server.url, SAGAPLANE_API_KEY=alice.api_key)
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(wal_path), str(effect), str(write_fd)],
        pass_fds=(write_fd,),
        env=env,
    )
    os.close(write_fd)
    try:
        assert os.read(read_fd, 1) == b"F"
        assert os.read(read_fd, 1) == b"E"  # blocks until the effect has happened
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        os.close(read_fd)
        proc.wait(60)
    assert proc.returncode == -signal.SIGKILL
    assert effect.read_text() == "charged 3"

    records = read_wal(wal_path)
    assert verify_chain(records).intact and integrity.verify(records).intact
    crashing_id = next(
        r["saga_id"] for r in records if r["event"] == "SAGA_START" and r["name"] == "crashing"
    )
    crashing = [r for r in records if r.get("saga_id") == crashing_id]
    assert [r["event"] for r in crashing] == ["SAGA_START", "STEP_INTENT", "STEP_COMMITTED", "STEP_INTENT"]
    assert crashing[-1]["tool"] == "charge" and crashing[-1]["kwargs"] == {"amount": 3}
    stream_id = json.loads((tmp_path / "agent.wal.meta.json").read_text())["stream_id"]

    client = sp.Client(live_server.url, alice.api_key)
    before = stream_of(client, stream_id)["length"]
    assert 0 < before <= len(records)  # the dead agent had shipped its first saga at least

    out = subprocess.run(
        [sys.executable, "-m", "sagaplane", "ship", str(wal_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert_server_holds_exactly(client, stream_id, records)
    held = saga_of(client, crashing_id)
    assert held["saga"]["recorded_status"] == "running"
    assert [(s["tool"], s["status"]) for s in held["steps"]] == [
        ("charge_ok", "committed"),
        ("charge", "intent"),
    ]

    # The restarted agent continues the same chain, and the server takes it.
    with sp.WAL(wal_path) as wal:
        wal.append("SAGA_START", {"saga_id": "after-restart", "pid": os.getpid(), "lease_ttl": 30.0})
    resumed = sp.Shipper(wal_path, url=live_server.url, api_key=alice.api_key)
    assert resumed.run_until_caught_up() == 1 and resumed.accepted == 1
    assert_server_holds_exactly(client, stream_id, read_wal(wal_path))


# -- 4. the control plane goes down during a run, then comes back -----------------------------------


class ServerProcess:
    """`uvicorn controlplane.asgi:application` as a child we can SIGKILL and restart on one port.
    Ready when uvicorn logs that it is listening (it logs after binding)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    def start(self) -> None:
        assert self.proc is None
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "controlplane.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--lifespan",
                "off",
                # Kept-alive connections outlive any pause between batches, however loaded the
                # machine: the test counts them (uvicorn's default closes them after 5 s idle).
                "--timeout-keep-alive",
                "600",
            ],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = threading.Event()

        def drain() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:  # keep reading so the pipe never fills and blocks the server
                self.log.append(line)
                if "Uvicorn running on" in line:
                    ready.set()
            ready.set()  # exited

        threading.Thread(target=drain, daemon=True).start()
        self.proc = proc
        assert ready.wait(120) and proc.poll() is None, "server did not start:\n" + "".join(self.log[-30:])

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None


def _bootstrap_sqlite(data_dir: Path, env: dict[str, str]) -> str:
    """A fresh embedded control plane in its own data folder; returns an ingest+read API key."""
    code = textwrap.dedent(
        """
        import django
        django.setup()
        from django.core.management import call_command
        from core.scoping import tenant_context
        from tenants import founding, services
        from tenants.actors import named_actor
        from tenants.inputs import NewApiKey
        call_command("migrate", verbosity=0)
        test = named_actor("test")
        tenant = founding.create_tenant(
            "outage", "Outage Co", "owner@outage.example", "pw-pw-pw-pw", actor=test
        )
        with tenant_context(tenant):
            key = services.create_api_key(tenant, NewApiKey("agent", ("ingest", "read")), actor=test)
        print(key[1])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture
def killable_server(transactional_db: None, tmp_path: Path) -> Any:
    env = clean_env(DJANGO_SETTINGS_MODULE="controlplane.settings")
    if connection.vendor == "postgresql":
        # The test database (test_<name>), the tenant created here (committed: transactional_db),
        # and the same data folder, so the server decrypts what this process encrypted.
        db = connection.settings_dict
        env["DATABASE_URL"] = (
            f"postgres://{urllib.parse.quote(db['USER'] or '')}:{urllib.parse.quote(db['PASSWORD'] or '')}"
            f"@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        )
        env["SAGAPLANE_DATA_DIR"] = str(settings.DATA_DIR)
        tenant = founding.create_tenant(
            "outage", "Outage Co", "owner@outage.example", "pw-pw-pw-pw", actor=named_actor("test")
        )
        key = in_tenant(
            tenant_services.create_api_key,
            tenant,
            NewApiKey(name="agent", scopes=["ingest", "read"]),
            actor=named_actor("test"),
        )[1]
    else:
        # The SQLite test database lives in this process's memory: give the server its own file.
        env.pop("DATABASE_URL", None)
        env.pop("REDIS_URL", None)
        env["SAGAPLANE_DATA_DIR"] = str(tmp_path / "cp-data")
        key = _bootstrap_sqlite(tmp_path / "cp-data", env)
    server = ServerProcess(env)
    server.start()
    try:
        yield server, key
    finally:
        if server.proc is not None:
            server.kill()


def server_batches(shipper: sp.Shipper) -> list[int]:
    """The batches the shipper had acknowledged, by size (recorded by `fast_shipper`)."""
    return shipper.batches  # type: ignore[attr-defined,no-any-return]


def test_control_plane_outage_agent_keeps_working_records_arrive_once_in_order(
    killable_server: Any, tmp_path: Path
) -> None:
    server, key = killable_server
    wal = sp.WAL(tmp_path / "agent.wal")
    shipper = fast_shipper(wal, server.url, key, batch_size=5)
    client = sp.Client(server.url, key)
    try:
        before = run_sagas(wal, tag="before")
        assert shipper.flush(60), shipper.failure
        shipped_before = len(read_wal(wal.path))
        assert stream_of(client, wal.stream_id)["length"] == shipped_before
        opened_before = shipper.client.connections_opened
        assert 1 <= opened_before < len(server_batches(shipper))  # batches share kept-alive connections

        server.kill()  # SIGKILL: no goodbye (the kept-alive connection dies with it)
        during = run_sagas(wal, tag="during")  # the agent keeps working: no exception from the outage
        with shipper._cond:  # the shipper noticed and is backing off, not failing
            assert shipper._cond.wait_for(lambda: shipper.retries >= 2, 60)
        assert shipper.failure is None and shipper.state in (ShipperState.BACKOFF, ShipperState.SHIPPING)
        on_disk = read_wal(wal.path)
        assert len(on_disk) > shipped_before and shipper.pending_bytes() > 0  # waiting on disk
        assert shipper.cursor.shipped == shipped_before
        assert not shipper.flush(0.2)  # cannot be caught up while the server is down

        server.start()  # same port
        assert shipper.flush(120), shipper.failure
        # The dead connection was replaced by a new one to the restarted server.
        assert shipper.client.connections_opened > opened_before
    finally:
        shipper.close()
        wal.close()
    records = read_wal(wal.path)
    assert verify_chain(records).intact
    assert shipper.retries >= 2 and shipper.accepted == len(records) and shipper.duplicates == 0
    assert_server_holds_exactly(client, wal.stream_id, records)
    for ids in (before, during):
        for status, saga_id in ids.items():
            assert saga_of(client, saga_id)["saga"]["status"] == status


# -- 5. refused keys ---------------------------------------------------------------------------------


def test_wrong_scope_and_revoked_keys_raise_authentication_error(
    transactional_db: None, live_server: Any, alice: Any, tmp_path: Path
) -> None:
    wal = sp.WAL(tmp_path / "agent.wal", fsync=False)
    with sp.saga(name="auth", wal=wal):
        reserve(1)
    wal.close()
    read_only_key = in_tenant(
        tenant_services.create_api_key,
        alice.tenant,
        NewApiKey(name="reader", scopes=["read"]),
        actor=named_actor("test"),
    )[1]
    revoked, revoked_key = in_tenant(
        tenant_services.create_api_key,
        alice.tenant,
        NewApiKey(name="old", scopes=["ingest", "read"]),
        actor=named_actor("test"),
    )
    with tenant_context(alice.tenant):
        tenant_services.revoke_api_key(revoked, actor=named_actor("test"))

    with pytest.raises(sp.AuthenticationError) as scope:
        sp.Shipper(wal.path, url=live_server.url, api_key=read_only_key).run_until_caught_up()
    assert scope.value.status == 403 and "scope" in str(scope.value)
    assert isinstance(scope.value, sp.ShipFailed)

    shipper = sp.Shipper(wal.path, url=live_server.url, api_key=revoked_key)
    with pytest.raises(sp.AuthenticationError) as rev:
        shipper.run_until_caught_up()
    assert rev.value.status == 401 and "revoked" in str(rev.value)
    assert shipper.state is ShipperState.FAILED and shipper.cursor.offset == 0

    # In the background: the agent keeps working, flush reports the failure, the reason is the key.
    # Ungated: this is about shipping (with the gate on, a revoked key refuses every step instead).
    runtime = sp.configure(tmp_path / "bg.wal", url=live_server.url, api_key=revoked_key, gate=False)
    try:
        with sp.saga(name="bg"):
            reserve(1)
        assert runtime.flush(30) is False
        assert runtime.shipper is not None and isinstance(runtime.shipper.failure, sp.AuthenticationError)
    finally:
        sp.shutdown(5)

    # The CLI exits 2 (configuration) and says why.
    out = subprocess.run(
        [sys.executable, "-m", "sagaplane", "ship", str(wal.path)],
        env=clean_env(SAGAPLANE_URL=live_server.url, SAGAPLANE_API_KEY=revoked_key),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "API key refused" in out.stderr and "revoked" in out.stderr

    # Nothing was stored.
    stream_id = json.loads((tmp_path / "agent.wal.meta.json").read_text())["stream_id"]
    assert sp.Client(live_server.url, alice.api_key).stream(stream_id).status == 404
