"""Reconciliation benchmark (issue 14, items 4-5).

N sagas whose one charge was compensated (the SDK's records: 7 per saga) go through the real
ingest; then, in the same process and database:

- the pass (`reconciliation.services.scan`) turns the N COMPENSATED records into N checks:
  checks/s, and its time as a fraction of the ingest that brought the records (the peer);
- observers claim (50 at a time) and answer every check (`claim` + `report`, each verdict one
  server-stream record in the same transaction): verdicts/s, against the peer of appending the
  same number of bare server records (`append_server_record`), so the ratio is reconciliation's
  own cost per verdict;
- the range report (`GET /api/v1/reconciliation/report`'s selector) and a signed certificate over
  all N steps: time each, against reading the same sagas' steps alone.

N = 10,000 (`--quick`: 1,000). Postgres when DATABASE_URL is set (a database of its own beside it,
`<name>_bench_reconcile`, made by the owner role), else embedded SQLite in a temporary folder.
Results: bench/results/reconciliation.json (quick: reconciliation-quick.json, not committed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.parse
from datetime import timedelta
from pathlib import Path
from typing import Any

from tenants.actors import api_key_actor, system_actor

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _own_database() -> str:
    """Point DATABASE_URL / DATABASE_OWNER_URL at `<name>_bench_reconcile` (created if missing)."""
    url, owner = os.environ["DATABASE_URL"], os.environ.get("DATABASE_OWNER_URL", "")
    if not owner.startswith(("postgres://", "postgresql://")):
        raise SystemExit(
            "set DATABASE_OWNER_URL (the owner role) beside DATABASE_URL, as infra/services.sh does"
        )
    import psycopg

    name = f"{urllib.parse.urlsplit(url).path.lstrip('/') or 'sagaplane'}_bench_reconcile"
    admin = urllib.parse.urlsplit(owner.replace("postgres://", "postgresql://", 1))
    with psycopg.connect(urllib.parse.urlunsplit(admin._replace(path="/postgres")), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    for var, base in (("DATABASE_URL", url), ("DATABASE_OWNER_URL", owner)):
        os.environ[var] = urllib.parse.urlunsplit(urllib.parse.urlsplit(base)._replace(path=f"/{name}"))
    return "postgres"


def _setup(data_dir: str) -> str:
    os.environ.setdefault("SAGAPLANE_DATA_DIR", data_dir)
    os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    os.environ["SAGAPLANE_RECONCILE_DELAY_SECONDS"] = "0"
    os.environ["SAGAPLANE_RECONCILE_WINDOW_SECONDS"] = "86400"  # no check may expire while answered
    mode = "embedded"
    if os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        mode = _own_database()
    else:
        for var in ("DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL"):
            os.environ.pop(var, None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return mode


def _saga(n: int) -> list[tuple[str, dict[str, Any]]]:
    saga_id, step_id = f"bench-{n}", f"bench-{n}-s0"
    step = {"saga_id": saga_id, "step_id": step_id, "tool": "shop.charge"}
    compensation = {
        "fn": "refund",
        "handler": "shop.refund",
        "recoverable": True,
        "description": "",
        "idempotency_key": f"idem-{n}",
        "kwargs": {"charge_id": f"ch_{n}"},
    }
    return [
        ("SAGA_START", {"saga_id": saga_id, "name": "checkout"}),
        ("STEP_INTENT", {**step, "semantics": "COMPENSABLE", "kwargs": {"amount": 42}}),
        ("STEP_COMMITTED", {**step, "semantics": "COMPENSABLE", "compensation": compensation}),
        ("ROLLBACK_START", {"saga_id": saga_id, "steps": 1}),
        ("COMPENSATED", {**step, "attempts": 1, "idempotency_key": f"idem-{n}"}),
        (
            "ROLLBACK_END",
            {
                "saga_id": saga_id,
                "clean": True,
                "compensated": 1,
                "failed": 0,
                "orphaned": 0,
                "unresolved": 0,
                "halted": False,
            },
        ),
        ("SAGA_ABORTED", {"saga_id": saga_id, "clean": True}),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1,000 sagas (CI, well under a minute)")
    parser.add_argument("--sagas", type=int, help="override N")
    args = parser.parse_args()
    n = args.sagas or (1_000 if args.quick else 10_000)
    mode = _setup(tempfile.mkdtemp(prefix="sagaplane-bench-reconcile-"))

    from django.utils import timezone
    from sagaplane.certificate import verify_certificate
    from sagaplane.chain import GENESIS, stamp

    from audit import services as audit_services
    from audit.services import append_server_record
    from core.scoping import tenant_context
    from reconciliation import selectors, services
    from reconciliation.inputs import Answer
    from sagas import selectors as saga_selectors
    from tenants import founding
    from transparency import services as transparency
    from transparency.tasks import integrate_fully

    slug = f"bench{int(time.time())}"
    tenant = founding.create_tenant(slug, "Bench", f"owner@{slug}.example", actor=system_actor("bench"))
    since = timezone.now() - timedelta(minutes=1)

    # -- the peer for the pass: ingesting the records it reads
    head, seq = GENESIS, 0
    start = time.perf_counter()
    for first in range(0, n, 100):
        batch = []
        for i in range(first, min(n, first + 100)):
            for event, fields in _saga(i):
                seq += 1
                record = {"seq": seq, "ts": time.time(), "event": event, **fields}
                head = stamp(record, head)
                batch.append(record)
        with tenant_context(tenant):  # as the ingest view enters it
            audit_services.ingest(tenant, "bench-agent", batch, actor=system_actor("bench"))
    ingest_s = time.perf_counter() - start

    start = time.perf_counter()
    created = 0
    while True:
        with tenant_context(tenant):  # the pass's transaction (reconciliation.tasks.reconcile_tenant)
            made = len(services.scan(tenant))
        created += made
        with tenant_context(tenant):
            from reconciliation.models import ReconciliationCursor

            caught_up = ReconciliationCursor.objects.get().scanned >= seq
        if caught_up:
            break
    scan_s = time.perf_counter() - start
    assert created == n, (created, n)

    # -- observers: claim 50, answer each (every tenth one drift)
    start = time.perf_counter()
    answered = 0
    while answered < n:
        terms = services.ReconciliationClaim.parse(
            {"handlers": ["shop.refund"], "worker": "bench", "max": 50}
        )
        with tenant_context(tenant):  # each a request's transaction, as the API's view enters it
            checks = services.claim(tenant, terms, actor=api_key_actor("bench"))
        assert checks, "ran out of checks before answering all"
        for check in checks:
            drift = int(check.kwargs["charge_id"][3:]) % 10 == 0
            with tenant_context(tenant):
                answer = Answer(check.token, not drift)
                services.report(tenant, check.pk, answer, actor=api_key_actor("bench"))
        answered += len(checks)
    observe_s = time.perf_counter() - start

    start = time.perf_counter()
    for i in range(n):
        with tenant_context(tenant):  # each its own transaction, as a request's change is
            append_server_record(
                tenant, "BENCH_PEER", {"saga_id": f"bench-{i}", "i": i}, actor=system_actor("bench")
            )
    append_s = time.perf_counter() - start

    # -- the range report and the certificate over all N, against reading the steps alone
    with tenant_context(tenant):
        start = time.perf_counter()
        report = selectors.report(since)
        report_s = time.perf_counter() - start
        start = time.perf_counter()
        steps = saga_selectors.effects_between(since, timezone.now(), now=timezone.now(), limit=50_000)
        read_s = time.perf_counter() - start
    assert report.counts["drift"] == n // 10 and report.counts["confirmed"] == n - n // 10, report.counts
    assert len(steps) == n
    integrate_fully(tenant)
    start = time.perf_counter()
    with tenant_context(tenant):
        note = services.issue_certificate(tenant, since, actor=system_actor("bench"))
    certificate_s = time.perf_counter() - start
    with tenant_context(tenant):
        keys = transparency.current_verifier_keys()
    start = time.perf_counter()
    cert = verify_certificate(note, keys)
    verify_s = time.perf_counter() - start
    assert len(cert.exceptions) == n // 10

    results = {
        "benchmark": "reconciliation",
        "mode": mode,
        "database": "postgresql" if mode != "embedded" else "sqlite",
        "sagas": n,
        "records_ingested": seq,
        "load_1min": round(os.getloadavg()[0], 2),
        "ingest_s": round(ingest_s, 3),
        "scan": {
            "s": round(scan_s, 3),
            "checks_per_s": round(n / scan_s),
            "vs_ingest": round(scan_s / ingest_s, 4),
        },
        "observe": {
            "s": round(observe_s, 3),
            "verdicts_per_s": round(n / observe_s),
            "peer_append_s": round(append_s, 3),
            "vs_bare_server_record": round(observe_s / append_s, 3),
        },
        "report": {
            "s": round(report_s, 3),
            "read_steps_s": round(read_s, 3),
            "vs_read": round(report_s / read_s, 3),
        },
        "certificate": {
            "issue_s": round(certificate_s, 3),
            "bytes": len(note.encode()),
            "exceptions": len(cert.exceptions),
            "verify_offline_s": round(verify_s, 4),
        },
    }
    print(json.dumps(results, indent=2))
    out = ROOT / "bench" / "results" / ("reconciliation-quick.json" if args.quick else "reconciliation.json")
    if args.sagas and not args.quick:
        out = out.with_name(f"reconciliation-{n}.json")
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
