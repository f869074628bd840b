"""The SDK's reconciler worker over real HTTP (Django's live server): what an observer returns is
what the control plane records, and only an explicit True confirms. False is drift; None, any
non-bool (1, "yes") and an exception are unverifiable, each with its reason."""

from __future__ import annotations

from typing import Any

import sagaplane as sp
from sagaplane.reconcile import since_value

from core.scoping import tenant_context
from reconciliation import services
from reconciliation.models import ReconciliationCheck
from tenants.models import Tenant
from tests.support.chains import Writer, compensated_saga
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.waiting import wait_until


def test_what_an_observer_returns_is_the_verdict(
    transactional_db: None, live_server: Any, alice: Person, tenant_a: Tenant, settings: Any
) -> None:
    settings.SAGAPLANE_RECONCILE_DELAY_SECONDS = 0
    writer = Writer(tenant_a, "agent-a-1")
    answers: dict[str, Any] = {
        "ch_true": True,
        "ch_false": False,
        "ch_none": None,
        "ch_one": 1,
        "ch_yes": "yes",
    }
    for charge in [*answers, "ch_raises"]:
        compensated_saga(writer, f"saga-{charge}", charges=[charge])
    in_tenant(services.scan, tenant_a)

    def observe(charge_id: str, idempotency_key: str | None = None) -> Any:
        assert idempotency_key and idempotency_key.startswith("idem-")
        if charge_id == "ch_raises":
            raise ConnectionError("ledger unreachable")
        return answers[charge_id]

    worker = sp.ReconcileWorker(
        sp.Client(live_server.url, alice.api_key),
        observers={"shop.refund": observe},
        name="observer-1",
        wait_s=0,
    )
    done = worker.run_once(wait_s=0)
    assert len(done) == 6 and all(o.recorded for o in done)
    with tenant_context(tenant_a):
        verdicts = {c.kwargs["charge_id"]: (c.status, c.reason) for c in ReconciliationCheck.objects.all()}
    assert verdicts == {
        "ch_true": ("confirmed", "reversed"),
        "ch_false": ("drift", "not_reversed"),
        "ch_none": ("unverifiable", "observer_unknown"),
        "ch_one": ("unverifiable", "observer_unknown"),
        "ch_yes": ("unverifiable", "observer_unknown"),
        "ch_raises": ("unverifiable", "observer_error"),
    }
    assert worker.run_once(wait_s=0) == []  # nothing left to answer


def test_relative_since_becomes_an_iso_time() -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    assert since_value("90m", now) == "2026-12-03T10:30:00Z"
    assert since_value("7d", now) == "2026-11-26T12:00:00Z"
    assert since_value("2026-01-01", now) == "2026-01-01"  # passed as given: the server judges it


def test_the_recovery_worker_also_runs_the_modules_reconcilers(
    transactional_db: None, live_server: Any, alice: Person, tenant_a: Tenant, settings: Any, tmp_path: Any
) -> None:
    """`sagaplane worker --handlers m`: m's @sp.compensator functions run recovery jobs and its
    @sp.reconciler functions answer reconciliation checks, in one process."""
    import os
    import signal
    import subprocess
    import sys

    settings.SAGAPLANE_RECONCILE_DELAY_SECONDS = 0
    compensated_saga(Writer(tenant_a, "agent-a-1"), "checkout-1", charges=["ch_1"])
    in_tenant(services.scan, tenant_a)
    (tmp_path / "shop_handlers.py").write_text(
        "import sagaplane as sp\n"
        "@sp.compensator('shop.refund')\n"
        "def refund(charge_id, idempotency_key=None):\n    pass\n"
        "@sp.reconciler('shop.refund')\n"
        "def refunded(charge_id):\n    return charge_id == 'ch_1'\n"
    )
    env = {**os.environ, "SAGAPLANE_URL": live_server.url, "SAGAPLANE_API_KEY": alice.api_key}
    worker = subprocess.Popen(
        [sys.executable, "-m", "sagaplane", "worker", "--handlers", "shop_handlers", "--wait", "1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def status() -> str:
        with tenant_context(tenant_a):
            return ReconciliationCheck.objects.get().status

    try:
        wait_until(
            lambda: status() == "confirmed", "the check confirmed", every=0.2, alive=worker, context=status
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)
    assert "observing shop.refund" in out
