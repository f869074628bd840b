"""Retries, a fallback and credential references through the REAL control plane (gate, ingest, the
saga projection, the dashboard, exports): the server accepts and shows each STEP_ATTEMPT with its
step and a COMPLETED_VIA_FALLBACK step as committed, and after the run the credential's bytes are
nowhere: not in the WAL's files, any table of the database, an export or a disclosure, the
dashboard's pages, nor the gate's request bodies."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from django.db import connection
from django.test import Client as Browser
from django.urls import reverse
from test_e2e_ship import saga_of

from core.rls import database_owner
from fleet import services as fleet
from fleet.stores import DatabaseStore
from tenants.actors import named_actor
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.transparency import settle

VALUE = "sk_live_e2e_5b0c9d1f7a3e42"
NEEDLES = [VALUE.encode(), base64.b64encode(VALUE.encode()), VALUE.encode().hex().encode()]


@pytest.fixture(autouse=True)
def _stores(settings: Any, tmp_path: Path) -> Iterator[None]:
    from controlplane.celery import app

    fleet.set_store(DatabaseStore())
    settings.SAGAPLANE_EXPORT_STORAGE = {
        "BACKEND": "transparency.storage.WriteOnceFileStorage",
        "OPTIONS": {"location": str(tmp_path / "exports")},
    }
    previous = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = previous
    fleet.set_store(None)


def leaks(data: bytes) -> bool:
    return any(needle in data for needle in NEEDLES)


def run_agent(url: str, api_key: str, wal: Path, sent: list[bytes]) -> dict[str, str]:
    """Two sagas: one whose charge succeeds on its third attempt and whose second step completes
    through its fallback; one rolled back, its compensation holding the credential's reference."""
    refunds: list[str] = []
    sp.compensator("e2e.vault_refund")(lambda charge_id, api_key: refunds.append(api_key))
    failures = {"charge": 2}

    def charge_fn(amount: int, api_key: str) -> dict[str, Any]:
        assert api_key == VALUE
        if failures["charge"]:
            failures["charge"] -= 1
            raise TimeoutError(f"upstream timed out (key {api_key})")
        return {"id": f"ch_{amount}"}

    def primary_fn(amount: int, api_key: str) -> str:
        raise sp.EffectNotApplied(f"declined for {api_key}")

    charge = sp.tool(
        charge_fn,
        name="vault.charge",
        semantics=sp.COMPENSABLE,
        compensate=lambda r, kwargs: sp.undo(
            "e2e.vault_refund", charge_id=r["id"], api_key=kwargs["api_key"]
        ),
        retry=sp.Retry(max_attempts=3, base_s=0.01, jitter=False),
    )
    backup = sp.tool(lambda amount, api_key: "sent by backup", name="vault.backup", semantics=sp.REVERSIBLE)
    notify = sp.tool(primary_fn, name="vault.notify", semantics=sp.PREVIEW, fallback=backup)

    runtime = sp.configure(
        wal, url=url, api_key=api_key, agent="vault-bot", secret_resolver={"stripe": VALUE}.get
    )
    try:
        assert runtime.gate is not None
        runtime.gate.refresh()  # the budget makes vault.* governed: each step is asked of the server
        ask = runtime.gate._ask
        real = ask.request_raw

        def recording(method: str, path: str, data: bytes | None = None, **kw: Any) -> Any:
            sent.append(data or b"")
            return real(method, path, data, **kw)

        ask.request_raw = recording  # type: ignore[method-assign]
        with sp.saga(name="retried") as first:
            charge(40, api_key=sp.secret("stripe"))
            assert notify(1, api_key=sp.secret("stripe")) == "sent by backup"
        with pytest.raises(sp.SagaAborted) as aborted, sp.saga(name="undone") as second:
            charge(2, api_key=sp.secret("stripe"))
            raise RuntimeError(f"the agent quotes {VALUE} by mistake")
        assert aborted.value.report.clean and refunds == [VALUE]
        assert runtime.flush(60), runtime.shipper and runtime.shipper.failure
    finally:
        sp.shutdown()
    return {"retried": first.saga_id, "undone": second.saga_id}


def every_table_text() -> Iterator[tuple[str, bytes]]:
    """Every row of every table, as text, read as the owner (no row-level security in the way)."""
    with database_owner(), connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f'SELECT * FROM "{table}"')  # noqa: S608 (names from the catalogue)
            for row in cursor.fetchall():
                yield (
                    table,
                    repr(row).encode() + b"".join(v for v in row if isinstance(v, bytes | memoryview)),
                )


def test_attempts_fallbacks_and_references_through_the_control_plane(
    transactional_db: None, live_server: Any, alice: Person, tmp_path: Path
) -> None:
    in_tenant(
        fleet.create_budget,
        alice.tenant,
        fleet.BudgetCreate.parse(
            {"name": "vault", "tool": "vault.*", "max_total": 10_000, "window_s": 86400}
        ),
        actor=named_actor("test"),
    )
    sent: list[bytes] = []
    ids = run_agent(live_server.url, alice.api_key, tmp_path / "wal" / "agent.wal", sent)

    # The server took every record and shows the attempts with their step.
    client = sp.Client(live_server.url, alice.api_key)
    retried = saga_of(client, ids["retried"])
    assert retried["saga"]["status"] == "completed"
    assert [s["status"] for s in retried["steps"]] == ["committed", "committed"]
    browser = Browser()
    browser.force_login(alice.user)
    page = browser.get(reverse("saga-detail", args=[ids["retried"]])).content
    assert page.count(b"<code>STEP_ATTEMPT</code>") >= 3 and b"COMPLETED_VIA_FALLBACK" in page
    assert (
        b'data-attempts="2"' in page and b'data-attempts="1"' in page and b"<code>vault.backup</code>" in page
    )
    assert b"&quot;$secret&quot;: &quot;stripe&quot;" in page  # shown as the reference
    assert saga_of(client, ids["undone"])["saga"]["status"] == "rolled_back"

    # The gate was asked (with the reference) and never saw the value.
    assert len(sent) >= 3 and all(b'"$secret": "stripe"' in body for body in sent if b"vault.charge" in body)
    assert not any(leaks(body) for body in sent)

    # Not in the WAL's files (segments, manifest, cursors, metadata).
    files = [p for p in (tmp_path / "wal").rglob("*") if p.is_file()]
    assert files and not [p for p in files if leaks(p.read_bytes())]

    # Not in an export or a disclosure.
    settle(alice.tenant)
    api = alice.session_client()
    made = api.post("/api/v1/audit/exports", {}, format="json")
    assert made.status_code == 202, made.content
    export_id = made.json()["id"]
    assert api.get(f"/api/v1/audit/exports/{export_id}").json()["status"] == "done"
    archive = b"".join(api.get(f"/api/v1/audit/exports/{export_id}/download").streaming_content)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert any(b"STEP_ATTEMPT" in data for data in members.values())
    assert not [name for name, data in members.items() if leaks(data)]
    for saga_id in ids.values():
        disclosure = api.get(f"/api/v1/audit/sagas/{saga_id}/disclosure")
        assert disclosure.status_code == 200 and not leaks(disclosure.content)
        assert b"$secret" in disclosure.content

    # Not on the dashboard's pages.
    pages = [reverse(name) for name in ("sagas", "saga-rows", "fleet", "recovery", "evidence")]
    pages += [reverse(view, args=[s]) for s in ids.values() for view in ("saga-detail", "saga-timeline")]
    for url in pages:
        response = browser.get(url)
        assert response.status_code == 200, url
        assert not leaks(response.content), url

    # Not in any table of the database.
    rows = 0
    for table, text in every_table_text():
        rows += 1
        assert not leaks(text), table
    assert rows > 50
    assert json.dumps(VALUE) not in repr(retried)
