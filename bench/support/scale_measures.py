"""bench/scale.py's measurements at a rung: proofs, the saga list (the API's and the dashboard
page's) and a WORM export, each through the request path."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

from bench.support.scale_database import analyze_sagas, table_sizes, tool_plans
from tenants.actors import system_actor

EXPORT_WINDOW = 100_000


def pct_ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)


def load_averages() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def api_samples(client: Any, path: str, params: dict[str, Any], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        response = client.get(path, params)
        samples.append(time.perf_counter() - start)
        assert response.status_code == 200, (path, response.status_code, response.content[:300])
    return samples


def api_listing(client: Any, tenant: Any, queries: int) -> dict[str, float]:
    from core.scoping import tenant_context
    from sagas.models import Saga

    with tenant_context(tenant):
        newest = Saga.objects.order_by("-last_activity_at").values_list("last_activity_at", flat=True).first()
    since = (newest.timestamp() - 3000) if newest else 0
    listing = {
        "all": api_samples(client, "/api/v1/sagas", {}, queries),
        "status=completed": api_samples(client, "/api/v1/sagas", {"status": "completed"}, queries),
        "status=running": api_samples(client, "/api/v1/sagas", {"status": "running"}, queries),
        "tool=tool.1": api_samples(client, "/api/v1/sagas", {"tool": "tool.1"}, queries),
        "tool=tool.rare": api_samples(client, "/api/v1/sagas", {"tool": "tool.rare"}, queries),
        "tool=tool.1&status=completed": api_samples(
            client, "/api/v1/sagas", {"tool": "tool.1", "status": "completed"}, queries
        ),
        "since=newest-3000s": api_samples(client, "/api/v1/sagas", {"since": str(since)}, queries),
    }
    pages = []
    for _ in range(max(1, queries // 20)):
        url = client.get("/api/v1/sagas").json()["next"]
        for _ in range(20):
            if not url:
                break
            start = time.perf_counter()
            response = client.get(url)
            pages.append(time.perf_counter() - start)
            url = response.json()["next"]
    listing["pages 2-21 by cursor"] = pages
    return {name: pct_ms(samples, 0.95) for name, samples in listing.items() if samples}


def page_listing(tenant: Any, queries: int) -> dict[str, float]:
    """The dashboard's saga list page (p95 ms) as the tenant's owner sees it, the whole page:
    status tabs (capped counts), filter choices, rows; then Older pages 2-11 by cursor."""
    import html
    import re

    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(email=f"owner@{tenant.slug}.example"))
    listing = {
        name: api_samples(client, "/sagas/", params, queries)
        for name, params in {
            "all": {},
            "status=completed": {"status": "completed"},
            "status=orphaned": {"status": "orphaned"},
            "tool=tool.1": {"tool": "tool.1"},
            "tool=tool.rare": {"tool": "tool.rare"},
            "since=24h": {"since": "24h"},
        }.items()
    }
    older = re.compile(r'<a href="([^"]*)" rel="next">')
    pages = []
    for _ in range(max(1, queries // 10)):
        found = older.search(client.get("/sagas/").content.decode())
        for _ in range(10):
            if not found:
                break
            start = time.perf_counter()
            response = client.get("/sagas/" + html.unescape(found.group(1)))
            pages.append(time.perf_counter() - start)
            found = older.search(response.content.decode())
    listing["Older pages 2-11"] = pages
    return {name: pct_ms(samples, 0.95) for name, samples in listing.items() if samples}


def proof_latencies(client: Any, tenant: Any, queries: int) -> dict[str, Any]:
    from core.scoping import tenant_context
    from transparency.models import Checkpoint

    with tenant_context(tenant):
        signed = Checkpoint.objects.order_by("-size").values_list("size", flat=True).first() or 0
    leaves = [random.randrange(signed) for _ in range(queries)]
    inclusion: list[float] = []
    consistency: list[float] = []
    # Untimed: a process's first request loads the URL configuration and the middleware (~120 ms
    # seen at the first rung, a p99 of 126 ms for 200 proofs), and each route's first answer
    # primes the lean proof path.
    api_samples(client, "/api/v1/audit/proofs/inclusion", {"index": 0}, 1)
    api_samples(client, "/api/v1/audit/proofs/consistency", {"first": 1}, 1)
    for leaf in leaves:
        inclusion += api_samples(client, "/api/v1/audit/proofs/inclusion", {"index": leaf}, 1)
    # Leaves of their own: the inclusion proofs just read their leaves' neighbourhoods.
    firsts = [random.randrange(1, signed + 1) for _ in range(queries)]
    for first in firsts:
        consistency += api_samples(client, "/api/v1/audit/proofs/consistency", {"first": first}, 1)
    # The same proofs without the request path (authentication, middleware, DRF, JSON): what the
    # tree's storage costs at this size, beside what the API adds.
    from transparency import proofs

    core_inclusion, core_consistency = [], []
    with tenant_context(tenant):
        for leaf in leaves:
            start = time.perf_counter()
            proofs.inclusion(leaf)
            core_inclusion.append(time.perf_counter() - start)
        for first in firsts:
            start = time.perf_counter()
            proofs.consistency(first)
            core_consistency.append(time.perf_counter() - start)
    return {
        "signed_size": signed,
        "inclusion_ms": {"p50": pct_ms(inclusion, 0.5), "p99": pct_ms(inclusion, 0.99)},
        "consistency_ms": {"p50": pct_ms(consistency, 0.5), "p99": pct_ms(consistency, 0.99)},
        "without_request_path_ms": {
            "inclusion": {"p50": pct_ms(core_inclusion, 0.5), "p99": pct_ms(core_inclusion, 0.99)},
            "consistency": {"p50": pct_ms(core_consistency, 0.5), "p99": pct_ms(core_consistency, 0.99)},
        },
    }


def export_rates(tenant: Any, signed: int, tmp: str) -> dict[str, Any]:
    """Build a WORM export of the newest EXPORT_WINDOW signed leaves; verify it offline."""
    from sagaplane.export import verify_export

    from core.scoping import tenant_context
    from transparency import services
    from transparency.models import Export
    from transparency.storage import get_storage
    from transparency.tasks import build_export_in

    first = max(0, signed - EXPORT_WINDOW)
    with tenant_context(tenant):
        export = services.request_export(tenant, actor=system_actor("bench"), first=first, end=signed)
    start = time.perf_counter()
    build_export_in(tenant, export.pk)
    build_s = time.perf_counter() - start
    with tenant_context(tenant):
        stored = Export.objects.get(pk=export.pk)
        vkey = services.current_verifier_keys()[0]
    archive = Path(tmp) / "export.tar.gz"
    with get_storage().open(stored.storage_name) as src:
        archive.write_bytes(src.read())
    start = time.perf_counter()
    report = verify_export(str(archive), vkey)
    verify_s = time.perf_counter() - start
    archive.unlink()
    return {
        "leaves": signed - first,
        "build_s": round(build_s, 2),
        "build_records_per_s": round((signed - first) / build_s),
        "verify_records_per_s": round(report.records / verify_s),
        "archive_bytes": stored.size if hasattr(stored, "size") else None,
    }


def measure(grower: Any, client: Any, queries: int, tmp: str) -> dict[str, Any]:
    from django.db import connection

    load_before = load_averages()
    analyze_sagas()
    integrate_s = grower.integrate()
    proofs = proof_latencies(client, grower.tenant, queries)
    result = {
        "records": grower.total,
        "integrate_rest_s": round(integrate_s, 2),
        **proofs,
        "saga_list_p95_ms": api_listing(client, grower.tenant, queries),
        "saga_list_page_p95_ms": page_listing(grower.tenant, queries),
        "export": export_rates(grower.tenant, proofs["signed_size"], tmp),
        "sizes": table_sizes(grower.total),
        "plans": tool_plans(grower.tenant),
        "database": connection.vendor,
        "load_average_before": load_before,
        "load_average_after": load_averages(),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "plans"}), flush=True)
    return result
