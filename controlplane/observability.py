"""What an on-call engineer reads: `/metrics` (Prometheus), one structured log line per request
(request id, tenant, actor, trace id), and OpenTelemetry traces when an exporter is configured.

- `RequestObservabilityMiddleware` (outermost): gives each request an id (a well-formed incoming
  `X-Request-ID`, as nginx's `$request_id`, is kept; otherwise a new one), echoes it, binds it
  for every log line of the request, counts ingest batches and gate decisions from the answers
  the views give (so the apps carry no metrics code), and logs the request when answered.
- `metrics_view`: `/metrics` for Prometheus. With `SAGAPLANE_METRICS_TOKEN` set, only a scrape
  bearing it (`Authorization: Bearer ...`) is answered; without one it answers in development
  only (404 in production, where it must not be public). Under gunicorn every worker's values
  are added up (multiprocess mode, infra/gunicorn.conf.py).

The JSON log format is `controlplane.logs`, traces `controlplane.tracing`.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import structlog
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from django.views.decorators.http import require_safe
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from core import metrics

log = logging.getLogger("sagaplane.requests")
collect_log = logging.getLogger(__name__)

REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{8,64}\Z")
INGEST_ROUTES = {"stream-records", "agent-saga-wal-ingest"}
GATE_ROUTES = {"gate-evaluate"}


# ------------------------------------------------------------------------------ requests


def _actor_and_tenant(response: HttpResponse) -> tuple[str, str]:
    """Who acted for which tenant, from the DRF view that answered (empty when none did)."""
    context = getattr(response, "renderer_context", None) or {}
    view = context.get("view")
    tenant = getattr(view, "tenant", None)
    slug = getattr(tenant, "slug", "") or ""
    actor = ""
    if slug:
        try:
            actor = str(view.actor)  # type: ignore[union-attr]
        except Exception:  # no authenticated principal (a refusal before authentication)
            actor = ""
    return actor, slug


def _record_ingest(response: HttpResponse, seconds: float) -> None:
    metrics.INGEST_SECONDS.observe(seconds)
    data = getattr(response, "data", None)
    data = data if isinstance(data, dict) else {}
    if 200 <= response.status_code < 300:
        accepted = data.get("accepted", data.get("records_ingested", 0))
        metrics.INGEST_RECORDS.labels("accepted").inc(accepted if isinstance(accepted, int) else 0)
        duplicates = data.get("duplicates", 0)
        metrics.INGEST_RECORDS.labels("duplicate").inc(duplicates if isinstance(duplicates, int) else 0)
        metrics.INGEST_BATCHES.labels("accepted", "").inc()
        return
    reason = metrics.reason_label(data.get("reason"), "") or metrics.reason_label(
        data.get("error"), f"http_{response.status_code}"
    )
    metrics.INGEST_BATCHES.labels("refused", reason).inc()


def _record_gate(response: HttpResponse) -> None:
    data = getattr(response, "data", None)
    record_gate_answer(response.status_code, data if isinstance(data, dict) else {})


def record_gate_answer(status: int, data: dict[str, Any]) -> None:
    """Count one answer of `POST /api/v1/gate/evaluate` (the lean path counts its own)."""
    if 200 <= status < 300 and data.get("decision") in ("allow", "deny", "pending_approval"):
        metrics.GATE_DECISIONS.labels(data["decision"], metrics.reason_label(data.get("reason"), "")).inc()
    else:
        reason = metrics.reason_label(data.get("error"), f"http_{status}")
        metrics.GATE_DECISIONS.labels("error", reason).inc()


def new_request_id(incoming: str) -> str:
    """A well-formed incoming `X-Request-ID` is kept; otherwise a new one."""
    return incoming if REQUEST_ID.match(incoming) else uuid.uuid4().hex


def log_request(
    method: str, path: str, route: str, status: int, seconds: float, *, tenant: str, actor: str
) -> None:
    """The request's one log line (the caller has bound its request id)."""
    metrics.HTTP_RESPONSES.labels(f"{status // 100}xx").inc()
    if not log.isEnabledFor(logging.INFO):
        return
    log.info(
        "%s %s %s %.1fms",
        method,
        path,
        status,
        seconds * 1000,
        extra={
            "http_method": method,
            "http_path": path,
            "http_route": route,
            "http_status": status,
            "duration_ms": round(seconds * 1000, 2),
            "tenant": tenant,
            "actor": actor,
        },
    )


def _redacted_path(path: str) -> str:
    from frontend.log_redaction import redact

    return redact(path) if "/invite/" in path else path


class RequestObservabilityMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        request_id = new_request_id(request.META.get("HTTP_X_REQUEST_ID", ""))
        request.META["HTTP_X_REQUEST_ID"] = request_id
        with structlog.contextvars.bound_contextvars(request_id=request_id):
            response = self.get_response(request)
            seconds = time.perf_counter() - started
            response.headers["X-Request-ID"] = request_id
            try:
                self._observe(request, response, seconds)
            except Exception:  # observing must never change an answer
                collect_log.exception("observing the request failed")
        return response

    def _observe(self, request: HttpRequest, response: HttpResponse, seconds: float) -> None:
        route = getattr(getattr(request, "resolver_match", None), "url_name", None) or ""
        if route in INGEST_ROUTES and request.method == "POST":
            _record_ingest(response, seconds)
        elif route in GATE_ROUTES and request.method == "POST":
            _record_gate(response)
        actor, tenant = _actor_and_tenant(response)
        log_request(
            request.method or "",
            _redacted_path(request.path),
            route,
            response.status_code,
            seconds,
            tenant=tenant,
            actor=actor,
        )


# -------------------------------------------------------------------------------- /metrics


def _integration_backlog() -> list[tuple[int, int, datetime | None]]:
    """(tenant id, leaves waiting, when the oldest was accepted) for each tenant whose log has
    accepted leaves not yet under a signed checkpoint. The one cross-tenant question is asked
    through the integrator's own function, then each tenant is entered and read in turn."""
    from core.scoping import tenant_context
    from tenants.entry import tenant_by_id
    from transparency import selectors

    backlog: list[tuple[int, int, datetime | None]] = []
    for tenant_id in selectors.tenants_to_integrate():
        tenant = tenant_by_id(tenant_id)
        if tenant is None:
            continue
        with tenant_context(tenant):
            waiting = selectors.integration_backlog(tenant)
        if waiting is not None:
            backlog.append((tenant_id, *waiting))
    return backlog


def _integration_lag() -> Iterator[tuple[str, str, float]]:
    now = datetime.now(UTC)
    backlog = _integration_backlog()
    yield (
        "sagaplane_integration_lag_leaves",
        "Accepted leaves not yet under a signed checkpoint, all tenants",
        float(sum(leaves for _, leaves, _ in backlog)),
    )
    oldest = [accepted for _, _, accepted in backlog if accepted is not None]
    yield (
        "sagaplane_integration_lag_seconds",
        "Age of the oldest accepted leaf not yet under a signed checkpoint (0 when none waits)",
        max(((now - accepted).total_seconds() for accepted in oldest), default=0.0),
    )
    yield (
        "sagaplane_integration_lagging_tenants",
        "Tenants whose log has leaves not yet under a signed checkpoint",
        float(len(backlog)),
    )


def celery_queue_depths() -> dict[str, int]:
    """Messages waiting in each Celery queue (the broker's own count, bounded by a 2 s timeout)."""
    from controlplane.celery import app

    names = [app.conf.task_default_queue or "celery"]
    depths: dict[str, int] = {}
    with app.connection_for_read() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)
        channel: Any = conn.default_channel  # kombu's virtual channel (redis, filesystem)
        for name in names:
            # The virtual transports' own count (Redis: LLEN over the priority lists; it is 0 for a
            # queue no worker has declared yet, where a passive declare would fail).
            depths[name] = int(channel._size(name))
    return depths


class ScrapeTimeCollector(Collector):
    """State read when scraped: integration lag, Celery queue depths, registered queues and gauges.
    A source that fails is left out of this scrape (and `sagaplane_scrape_errors` says which)."""

    def collect(self) -> Iterable[GaugeMetricFamily]:
        errors = GaugeMetricFamily(
            "sagaplane_scrape_errors", "Sources that failed during this scrape", labels=["source"]
        )
        try:
            for name, documentation, value in _integration_lag():
                yield GaugeMetricFamily(name, documentation, value=value)
        except Exception:
            collect_log.warning("metrics: integration lag could not be read", exc_info=True)
            errors.add_metric(["integration_lag"], 1)
        try:
            depths = celery_queue_depths()
            family = GaugeMetricFamily(
                "sagaplane_celery_queue_depth", "Messages waiting in a Celery queue", labels=["queue"]
            )
            for queue, depth in depths.items():
                family.add_metric([queue], depth)
            yield family
        except Exception:
            collect_log.warning("metrics: Celery queue depth could not be read", exc_info=True)
            errors.add_metric(["celery_queue_depth"], 1)
        queues = GaugeMetricFamily(
            "sagaplane_queue_depth",
            "Work waiting for people or workers, by queue (approvals, recoveries, ...)",
            labels=["queue"],
        )
        for queue_source, read_depths in metrics.queues().items():
            try:
                waiting = dict(read_depths())
            except Exception:
                collect_log.warning("metrics: queue %s could not be read", queue_source, exc_info=True)
                errors.add_metric([f"queue:{queue_source}"], 1)
                continue
            for queue, depth in sorted(waiting.items()):
                queues.add_metric([queue], float(depth))
        yield queues
        for source in metrics.gauge_sources():
            try:
                family = GaugeMetricFamily(
                    f"sagaplane_{source.name}", source.documentation, labels=list(source.labels)
                )
                for labels, value in source.read():
                    family.add_metric([labels.get(label, "") for label in source.labels], value)
                yield family
            except Exception:
                collect_log.warning("metrics: %s could not be read", source.name, exc_info=True)
                errors.add_metric([source.name], 1)
        yield errors


def registry() -> CollectorRegistry:
    """This scrape's registry: every process' counters (multiprocess mode) or this one's, and
    the state read now."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        from prometheus_client import REGISTRY

        registry = CollectorRegistry()
        for collector in list(REGISTRY._collector_to_names):
            registry.register(collector)
    registry.register(ScrapeTimeCollector())
    return registry


def _authorised(request: HttpRequest) -> bool:
    token = settings.SAGAPLANE_METRICS_TOKEN
    if not token:
        return not settings.PRODUCTION
    scheme, _, offered = request.headers.get("Authorization", "").partition(" ")
    return scheme == "Bearer" and hmac.compare_digest(offered.strip().encode(), token.encode())


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _authorised(request):
        return HttpResponseNotFound(b"", content_type="text/plain")
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
