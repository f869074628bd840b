"""Reconciliation with real processes: a control plane (daphne) with its Celery worker and beat on
a Postgres database and a Redis of the test's own; agents that are real SDK processes whose
sagas fail and compensate in-process (the SDK's COMPENSATED records, shipped over HTTP); an SDK
`sagaplane reconcile-worker` whose `@sp.reconciler` reads an external ledger (a file); and the
`sagaplane reconcile` / `certify` commands as a CI job would run them.

- acme: a refund that reached the ledger → exit 0 and a clean certificate; then a "compensated"
  refund that never reached it → drift, exit 1, the certificate names it, a tampered copy fails;
- bravo: compensations nobody observes → unverifiable, exit 3, while pending and after the
  deadline alike, never 0;
- carol (a third tenant) sees none of it, and cannot answer acme's checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hostile.production import as_owner, manage, own_database, own_redis
from tests.support.ports import free_port
from tests.support.probes import healthy
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
DEADLINE = 90.0
WINDOW_S = 8  # a check nobody claims is unverifiable this long after the compensation

AGENT = textwrap.dedent(
    """
    import json, sys
    import sagaplane as sp

    ledger, wal, name, charge_id, refund_mode, handler = sys.argv[1:7]

    @sp.compensator("shop.refund")
    def refund(charge_id, idempotency_key=None):
        if refund_mode == "lies":
            return  # answers "refunded" and never reaches the ledger
        with open(ledger, "a") as out:
            out.write(json.dumps({"refund": charge_id, "key": idempotency_key}) + "\\n")

    @sp.compensator("shop.void")
    def void(charge_id, idempotency_key=None):
        pass

    def charge_card(amount):
        return {"id": charge_id}

    charge = sp.tool(
        charge_card, name="shop.charge", semantics=sp.COMPENSABLE,
        compensate=lambda result: sp.undo(handler, charge_id=result["id"]),
    )
    runtime = sp.configure(wal, gate=False, agent="checkout-bot")
    try:
        with sp.saga(name=name):
            charge(amount=42)
            raise RuntimeError("the order failed downstream")
    except sp.SagaAborted as aborted:
        assert aborted.report.clean, aborted.report.summary()
    assert runtime.flush(60), "the control plane did not acknowledge the records"
    sp.shutdown()
    """
)

OBSERVERS = textwrap.dedent(
    """
    import json, os
    import sagaplane as sp

    @sp.reconciler("shop.refund")
    def refund_landed(charge_id, idempotency_key=None):
        try:
            with open(os.environ["LEDGER"]) as ledger:
                return any(json.loads(line)["refund"] == charge_id for line in ledger if line.strip())
        except FileNotFoundError:
            return False
    """
)


@dataclass
class Live:
    url: str
    keys: dict[str, str]  # tenant slug → API key (ingest, read, recovery, audit)
    folder: Path
    env: dict[str, str]
    logs: list[Path]

    def sdk_env(self, tenant: str, **extra: str) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("SAGAPLANE_", "DJANGO_", "DATABASE_"))
        }
        return {**env, "SAGAPLANE_URL": self.url, "SAGAPLANE_API_KEY": self.keys[tenant], **extra}

    def sagaplane(self, tenant: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sagaplane", *args],
            cwd=self.folder,
            env=self.sdk_env(tenant),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def agent(
        self, tenant: str, name: str, charge: str, *, refund: str = "honest", handler: str = "shop.refund"
    ) -> None:
        wal = self.folder / f"{tenant}-{name}.wal"
        done = subprocess.run(
            [
                sys.executable,
                str(self.folder / "agent.py"),
                str(self.ledger),
                str(wal),
                name,
                charge,
                refund,
                handler,
            ],
            cwd=self.folder,
            env=self.sdk_env(tenant),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    @property
    def ledger(self) -> Path:
        return self.folder / "ledger.jsonl"

    def get(self, tenant: str, path: str, **params: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.keys[tenant]}"}
        return httpx.get(f"{self.url}{path}", params=params, headers=headers, timeout=30)

    def post(self, tenant: str, path: str, body: dict[str, Any]) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.keys[tenant]}"}
        return httpx.post(f"{self.url}{path}", json=body, headers=headers, timeout=60)

    def tails(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.logs)


def _start(command: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT) -> subprocess.Popen[Any]:
    with log.open("w") as out:
        return subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(processes: list[subprocess.Popen[Any]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    folder = tmp_path_factory.mktemp("reconciliation-live")
    with own_database() as database, own_redis(folder) as redis:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGAPLANE_", "DJANGO_", "DB_"))}
        env.pop("DATABASE_OWNER_URL", None)
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "controlplane.settings",
                "DATABASE_URL": database.url,
                "REDIS_URL": redis.url,
                "SAGAPLANE_DATA_DIR": str(folder / "data"),
                "SAGAPLANE_RECONCILE_SECONDS": "0.5",
                "SAGAPLANE_RECONCILE_DELAY_SECONDS": "0",
                "SAGAPLANE_RECONCILE_WINDOW_SECONDS": str(WINDOW_S),
                "PYTHONUNBUFFERED": "1",
            }
        )
        (folder / "data").mkdir()
        manage({**env, "DATABASE_OWNER_URL": as_owner(database.url)}, "migrate", "--noinput")
        keys = {}
        for slug in ("acme", "bravo", "carol"):
            manage(
                env,
                "create_tenant",
                slug,
                "--name",
                slug.title(),
                "--owner-email",
                f"owner@{slug}.example",
                "--owner-password",
                "live-owner-password",
            )
            out = manage(
                env,
                "create_api_key",
                "--tenant",
                slug,
                "--name",
                "ci",
                "--scopes",
                "ingest,read,recovery,audit",
            )
            keys[slug] = out.strip().splitlines()[-1]
        (folder / "agent.py").write_text(AGENT)
        (folder / "observers.py").write_text(OBSERVERS)
        port = free_port()
        logs = [folder / "server.log", folder / "celery.log"]
        processes = [
            _start(
                [
                    str(VENV_BIN / "daphne"),
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "controlplane.asgi:application",
                ],
                env,
                logs[0],
            ),
            _start(
                [
                    str(VENV_BIN / "celery"),
                    "-A",
                    "controlplane",
                    "worker",
                    "-B",
                    "--pool=solo",
                    "--loglevel=INFO",
                    "-n",
                    f"reconcile-live-{port}@%h",
                    "-s",
                    str(folder / "data" / "beat-schedule"),
                ],
                env,
                logs[1],
            ),
        ]
        server = Live(f"http://127.0.0.1:{port}", keys, folder, env, logs)
        try:
            wait_until(
                lambda: healthy(server.url),
                "the control plane to answer /healthz",
                deadline=DEADLINE,
                context=server.tails,
            )
            yield server
        finally:
            _stop(processes)


def _signed(server: Live, tenant: str) -> bool:
    return server.get(tenant, "/api/v1/audit/checkpoint").status_code == 200


def test_reconciliation_end_to_end(live: Live) -> None:
    observer = _start(
        [sys.executable, "-m", "sagaplane", "reconcile-worker", "--handlers", "observers", "--wait", "5"],
        live.sdk_env("acme", LEDGER=str(live.ledger)),
        live.folder / "observer.log",
        cwd=live.folder,
    )
    live.logs.append(live.folder / "observer.log")
    try:
        # acme 1: the refund reached the ledger: confirmed, exit 0, a clean certificate.
        live.agent("acme", "checkout-ok", "ch_ok")
        done = live.sagaplane("acme", "reconcile", "--since", "1h", "--wait", "60")
        assert done.returncode == 0, done.stdout + done.stderr + live.tails()
        assert "CONFIRMED: 1 compensated effect(s)" in done.stdout
        wait_until(
            lambda: _signed(live, "acme"),
            "acme's first signed checkpoint",
            deadline=DEADLINE,
            context=live.tails,
        )
        clean = live.sagaplane("acme", "certify", "--since", "1h")
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert clean.stdout.startswith("CLEAN:")

        # acme 2: "compensated", yet absent from the ledger: drift, exit 1, named in the certificate.
        live.agent("acme", "checkout-lies", "ch_lost", refund="lies")
        drift = live.sagaplane("acme", "reconcile", "--since", "1h", "--wait", "60")
        assert drift.returncode == 1, drift.stdout + drift.stderr + live.tails()
        assert "DRIFT" in drift.stdout and "checkout-lies" in drift.stdout
        key = live.get("acme", "/api/v1/audit/key").text.splitlines()[0]
        saved = live.folder / "acme.certificate"
        cert = live.sagaplane("acme", "certify", "--since", "1h", "--key", key, "--out", str(saved))
        assert cert.returncode == 1, cert.stdout + cert.stderr
        assert "DRIFT" in cert.stdout and "checkout-lies" in cert.stdout
        # Offline: no URL, no key for the API, only the verifier key.
        offline = subprocess.run(
            [sys.executable, "-m", "sagaplane", "certify", "--file", str(saved), "--key", key],
            cwd=live.folder,
            env={"PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert offline.returncode == 1 and "1 exception(s)" in offline.stdout, offline.stdout + offline.stderr
        tampered = live.folder / "tampered.certificate"
        tampered.write_text(saved.read_text().replace('"reason":"drift"', '"reason":"fixed"'))
        forged = live.sagaplane("acme", "certify", "--file", str(tampered), "--key", key)
        assert forged.returncode == 4 and forged.stdout.startswith("FAILED"), forged.stdout

        # bravo: nobody observes its compensations: unverifiable (3) while pending and after.
        live.agent("bravo", "checkout-unwatched", "ch_b", handler="shop.void")
        pending = live.sagaplane("bravo", "reconcile", "--since", "1h")
        assert pending.returncode == 3, pending.stdout + pending.stderr
        expired = live.sagaplane(
            "bravo", "reconcile", "--since", "1h", "--wait", str(WINDOW_S + 60), "--json"
        )
        assert expired.returncode == 3, expired.stdout + expired.stderr
        report = json.loads(expired.stdout)
        assert [
            (i["saga_id"].startswith("checkout-unwatched"), i["outcome"], i["reason"])
            for i in report["items"]
        ] == [(True, "unverifiable", "no_observer")]
        assert "ch_ok" not in expired.stdout and "checkout-lies" not in expired.stdout

        # carol: a third tenant sees nothing, and cannot answer acme's checks.
        quiet = live.sagaplane("carol", "reconcile", "--since", "1h", "--json")
        assert quiet.returncode == 0 and json.loads(quiet.stdout)["items"] == [], quiet.stdout
        acme_report = live.get("acme", "/api/v1/reconciliation/report", since="2000-01-01").json()
        (drifted,) = [i for i in acme_report["items"] if i["outcome"] == "drift"]
        answer = live.post(
            "carol",
            f"/api/v1/reconciliation/checks/{drifted['check']}/report",
            {"token": 1, "reversed": True},
        )
        assert answer.status_code == 404 and answer.json()["error"] == "not_found"
        assert live.post("carol", "/api/v1/reconciliation/claim", {"handlers": ["shop.refund"]}).json() == {
            "checks": []
        }
    finally:
        _stop([observer])
    # The observer's own view: two answers, one confirmed, one drift (tokens it held, all recorded).
    log = (live.folder / "observer.log").read_text()
    assert "observing shop.refund" in log
