"""The gate's lean path (Redis store, Postgres, outside any transaction), as agents' calls take it:
one SQL statement batch per decision that still commits the ledger row before an allow, debits
once per idempotency key and nothing on a refusal; a policy change or a key revocation reaches
another process on its very next call; and `POST /api/v1/gate/evaluate` answered in front of
Django's stack (controlplane/gate_asgi.py) as Django answers it, everything unusual handed on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.asgi import get_asgi_application
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.gate_asgi import PATH, lean_gate
from core import epoch
from core.scoping import tenant_context
from fleet import services
from fleet.models import Decision
from fleet.stores import RedisStore, marker_key
from tenants import fastroute, founding
from tenants import services as tenant_services
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import Tenant
from tests.fleet.concurrency import running_database_url
from tests.fleet.lean import ACTOR, ask, ledger
from tests.hostile.production import OwnRedis
from tests.support.scoping import in_tenant

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture
def tenant(transactional_db: None, store: RedisStore) -> Tenant:
    tenant = founding.create_tenant("lean", "Lean", "owner@lean.example", actor=named_actor("test"))
    # A new tenant has no ledger: its Redis state is ready as it is (no rebuild behind the fence).
    store.client.set(marker_key(services.gate_tag(tenant)), "1")
    return tenant


_calls = iter(range(10**9))


def call(tool: str = "stripe.charge", **args: Any) -> dict[str, Any]:
    n = next(_calls)
    return {"saga_id": f"saga-{n}", "step_id": "1", "tool": tool, "args": args, "agent": "bot"}


def test_a_decision_is_one_statement_batch_and_its_row_is_committed(
    tenant: Tenant, store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(epoch, "MAX_AGE_S", 3600.0)  # however slow the machine, the copy is reused
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse({"name": "cap", "tool": "stripe.*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    assert ask(tenant, call(amount=1))["decision"] == "allow"  # policies now held
    with CaptureQueriesContext(connection) as captured:
        answer = ask(tenant, call(amount=2))
    assert answer["decision"] == "allow"
    assert len(captured.captured_queries) == 1, [str(q["sql"])[:90] for q in captured.captured_queries]
    sent = str(captured.captured_queries[0]["sql"])
    # The fast route's statement-scoped block sends the batch as it is: the tenant set once.
    assert sent.count("sagaplane.tenant_id") == 1 and "INSERT" in sent, sent[:200]
    rows = [r for r in ledger(tenant) if str(r.pk) == answer["authorization_id"]]
    assert len(rows) == 1 and rows[0].decision == Decision.ALLOW
    assert rows[0].debits[0]["amount"] == 2 * 10_000 and rows[0].tenant_id == tenant.pk


def test_a_refusal_debits_nothing_and_a_retry_debits_once(tenant: Tenant, store: RedisStore) -> None:
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse({"name": "cap", "tool": "stripe.*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    first = call(amount=30)
    allowed = ask(tenant, first)
    assert allowed["decision"] == "allow"
    assert ask(tenant, first) == allowed  # Redis' idempotency key
    for key in store.client.scan_iter(match="*:idem:*"):
        store.client.delete(key)  # expired after its week, say: the retry is debited again...
    assert ask(tenant, first) == allowed  # ...but the ledger's unique allow (ON CONFLICT) stands
    refused = ask(tenant, call(amount=50))  # 60 counted (the second debit stays, erring to refuse)
    assert refused["reason"] == "budget_exceeded" and refused["remaining"] == "40"
    assert ask(tenant, call(amount=40))["decision"] == "allow"  # the refusal debited nothing
    rows = ledger(tenant)
    assert [r.decision for r in rows].count(Decision.ALLOW) == 2
    assert [r.reason for r in rows if r.decision == Decision.DENY] == ["budget_exceeded"]


def test_an_approval_policy_takes_the_decision_into_the_tenants_transaction(
    tenant: Tenant, store: RedisStore
) -> None:
    from approvals import services as approvals

    in_tenant(
        approvals.create_policy,
        tenant,
        approvals.PolicyCreate.parse(
            {
                "name": "large wires",
                "tool": "bank.*",
                "predicates": [{"arg": "amount", "op": ">", "value": 50}],
                "required_approvals": 1,
            }
        ),
        actor=ACTOR,
    )
    assert ask(tenant, call(tool="bank.wire", amount=10))["decision"] == "allow"
    pending = ask(tenant, call(tool="bank.wire", amount=500))
    assert pending["decision"] == "pending_approval"


@pytest.fixture
def worker(tenant: Tenant, private_redis: OwnRedis) -> Iterator[subprocess.Popen[str]]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "DATABASE_OWNER_URL", "PYTEST_CURRENT_TEST")
    }
    env.update(DATABASE_URL=running_database_url(), PYTHONPATH=str(ROOT))
    config = {"tenant": tenant.slug, "redis_url": private_redis.url}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fleet.lean_worker", json.dumps(config)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.strip() == "ready", process.stderr.read() if process.stderr else line
    yield process
    process.kill()
    process.communicate(timeout=30)


def tell(worker: subprocess.Popen[str], command: str) -> dict[str, Any]:
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(command + "\n")
    worker.stdin.flush()
    line = worker.stdout.readline()
    assert line, worker.stderr.read() if worker.stderr else "the worker exited"
    return dict(json.loads(line))


def test_a_policy_change_reaches_another_process_on_its_next_call(
    tenant: Tenant, store: RedisStore, worker: subprocess.Popen[str]
) -> None:
    decide = "decide " + json.dumps(call(amount=5))
    assert tell(worker, decide)["decision"] == "allow"  # the worker now holds the policies
    halt = in_tenant(
        services.halt,
        tenant,
        services.HaltCreate.parse({"scope": "tool:stripe.*", "reason": "incident"}),
        actor=ACTOR,
    )
    assert tell(worker, "decide " + json.dumps(call(amount=5)))["reason"] == "halted"
    in_tenant(services.resume, tenant, halt.pk, actor=ACTOR)
    assert tell(worker, "decide " + json.dumps(call(amount=5)))["decision"] == "allow"
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse({"name": "tiny", "tool": "stripe.*", "max_total": 1, "window_s": 3600}),
        actor=ACTOR,
    )
    assert tell(worker, "decide " + json.dumps(call(amount=5)))["reason"] == "budget_exceeded"
    in_tenant(
        services.quarantine,
        tenant,
        "held",
        services.QuarantineCreate.parse({"reason": "r", "preemptive": True}),
        actor=ACTOR,
    )
    quarantined = {**call(tool="crm.insert"), "saga_id": "held"}
    assert tell(worker, "decide " + json.dumps(quarantined))["reason"] == "quarantined"


def test_a_revoked_key_is_refused_by_another_process_on_its_next_request(
    tenant: Tenant, worker: subprocess.Popen[str]
) -> None:
    api_key, raw = in_tenant(
        tenant_services.create_api_key,
        tenant,
        NewApiKey(name="agent", scopes=["gate"]),
        actor=named_actor("test"),
    )
    assert tell(worker, f"verify {raw}") == {"ok": True}  # the worker now holds the key
    assert tell(worker, f"verify {raw}") == {"ok": True}
    assert tell(worker, f"verify {raw[:-1]}x")["error"] == "invalid_api_key"  # the secret is checked
    with tenant_context(api_key.tenant):
        tenant_services.revoke_api_key(api_key, actor=named_actor("test"))
    assert tell(worker, f"verify {raw}")["error"] == "revoked_api_key"


# ------------------------------------------------------------------------------------- over ASGI


class Served:
    """The lean gate in front of Django's ASGI handler, counting the calls Django answered."""

    def __init__(self) -> None:
        self.app = lean_gate(get_asgi_application())
        self.django_calls = 0
        inner = self.app.app

        async def counting(scope: Any, receive: Any, send: Any) -> None:
            self.django_calls += 1
            await inner(scope, receive, send)

        self.app.app = counting

    def post(
        self,
        body: Any,
        key: str,
        *,
        raw: bytes | None = None,
        query: str = "",
        scheme: str = "http",
        full: bool = False,
    ) -> httpx.Response:
        """The call through the lean path (`full`: straight to Django's stack)."""

        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app.app if full else self.app)  # type: ignore[arg-type]
            async with httpx.AsyncClient(transport=transport, base_url=f"{scheme}://127.0.0.1") as client:
                return await client.post(
                    PATH + query,
                    content=raw if raw is not None else json.dumps(body).encode(),
                    headers={
                        "Authorization": f"Bearer {key}",
                        "Content-Type": "application/json",
                        "X-Forwarded-Proto": "https",
                    },
                )

        return asyncio.run(send())


def test_the_gate_route_is_answered_in_front_of_django_as_django_answers_it(
    tenant: Tenant, store: RedisStore, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    monkeypatch.setattr(fastroute, "HEADERS", fastroute.RouteHeaders())  # as in a new process
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse({"name": "cap", "tool": "stripe.*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    api_key, raw = in_tenant(
        tenant_services.create_api_key,
        tenant,
        NewApiKey(name="agent", scopes=["gate"]),
        actor=named_actor("test"),
    )
    _, reader = in_tenant(
        tenant_services.create_api_key,
        tenant,
        NewApiKey(name="reader", scopes=["read"]),
        actor=named_actor("test"),
    )
    served = Served()

    by_django = served.post(call(amount=10), raw)
    assert by_django.status_code == 200 and by_django.json()["decision"] == "allow"
    assert served.django_calls == 1  # the first answer teaches the route's headers
    lean = served.post(call(amount=20), raw)
    assert lean.status_code == 200 and lean.json()["decision"] == "allow"
    assert served.django_calls == 1
    assert set(lean.headers) == set(by_django.headers)
    assert lean.headers["x-content-type-options"] == "nosniff" and lean.headers["x-request-id"]
    refused = served.post(call(amount=80), raw)
    assert refused.json()["reason"] == "budget_exceeded" and served.django_calls == 1
    assert [r.decision for r in ledger(tenant)].count(Decision.ALLOW) == 2

    # Anything unusual is Django's to answer, in the API's error shape.
    for response in (
        served.post(b"", raw, raw=b"{not json"),
        served.post({**call(amount=1), "saga_id": ""}, raw),
        served.post(call(amount=1), reader),
        served.post(call(amount=1), raw[:-1] + "x"),
        served.post(call(amount=1), raw, query="?x=1"),
    ):
        assert response.status_code in (200, 400, 401, 403), response.text
        if response.status_code != 200:
            assert set(response.json()) >= {"error", "detail"}
    assert served.django_calls == 6
    with tenant_context(api_key.tenant):
        tenant_services.revoke_api_key(api_key, actor=named_actor("test"))
    revoked = served.post(call(amount=1), raw)
    assert revoked.status_code == 401 and revoked.json()["error"] == "revoked_api_key"


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_gate_route_has_djangos_headers_for_its_request_class(
    tenant: Tenant, store: RedisStore, settings: Any, monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    """The fast route answers with the header names and security headers Django's stack gives a call
    of the same class: over https HSTS is among them, over http it is not, whichever class the
    route learnt first."""
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    settings.SECURE_HSTS_SECONDS = 3600  # SecurityMiddleware sends HSTS over https only
    settings.SECURE_PROXY_SSL_HEADER = None  # the class is the scheme of the call itself
    monkeypatch.setattr(fastroute, "HEADERS", fastroute.RouteHeaders())  # as in a new process
    _, raw = in_tenant(
        tenant_services.create_api_key,
        tenant,
        NewApiKey(name="agent", scopes=["gate"]),
        actor=named_actor("test"),
    )
    served = Served()
    assert served.post(call(amount=1), raw, scheme="https" if scheme == "http" else "http").status_code == 200
    assert served.django_calls == 1  # the other class is learnt first

    def names_and_security(response: httpx.Response) -> tuple[set[str], dict[str, str]]:
        names = set(response.headers) - {"x-request-id"}
        security = {
            k: v
            for k, v in response.headers.items()
            if k.startswith(("x-frame", "x-content", "strict-", "referrer", "cross-"))
        }
        return names, security

    for _ in range(2):  # the first call of this class is Django's; the second, the fast route's
        fast = served.post(call(amount=1), raw, scheme=scheme)
        normal = served.post(call(amount=1), raw, scheme=scheme, full=True)
        assert fast.status_code == normal.status_code == 200
        assert names_and_security(fast) == names_and_security(normal)
        assert ("strict-transport-security" in fast.headers) is (scheme == "https")
        assert {"x-content-type-options", "x-frame-options", "referrer-policy"} <= set(fast.headers)
    assert served.django_calls == 1 + 1 + 2  # the other class, this class' first call, the two direct ones
    assert fastroute.FastRoute("gate-evaluate", "POST").path == PATH  # the route table's path


def test_a_reservation_on_the_lean_path_is_recorded_with_its_bucket_and_settles(
    tenant: Tenant, store: RedisStore
) -> None:
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse({"name": "cap", "tool": "stripe.*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    answer = ask(tenant, {**call(), "reserve": 40 * 10_000})  # no amount: the estimate stands for it
    assert answer["reservation"] == {"id": answer["authorization_id"], "state": "open", "reserved": "40"}
    (row,) = [r for r in ledger(tenant) if str(r.pk) == answer["authorization_id"]]
    assert row.detail["reservation"]["store_ms"] > 0 and row.debits[0]["amount"] == 40 * 10_000
    assert ask(tenant, call(amount=61))["decision"] == "deny"
    settled = in_tenant(
        services.settle_reservation, tenant, row.pk, services.GateSettle.parse({"actual": "10"}), actor=ACTOR
    )
    assert settled is not None and settled["actual"] == "10"
    assert ask(tenant, call(amount=91))["decision"] == "deny"
    assert ask(tenant, call(amount=90))["decision"] == "allow"
