"""Liveness and readiness. /healthz answers while the process runs; /readyz checks every
backing service this deployment is configured to use and names the ones that fail.

Both are unauthenticated and answer plain http in production too (SECURE_REDIRECT_EXEMPT), since
in-cluster probes do not speak TLS. So /readyz says only which component failed: the backend's
own error text (host names, ports, driver messages) goes to the log, never to the caller.
`detail.recovery_sweep` says whether the recovery sweep is running (`ok`, `lagging` past
`recovery.sweeper.LAG_WARN_S`, `never_ran`) and its lag in seconds; it never fails readiness."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_safe

log = logging.getLogger(__name__)


@require_safe  # probes GET (or HEAD); anything else is a 405, like every other route
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _check_database_roles() -> None:
    """DATABASE_URL's role must be one row-level security binds (core/rls.py); a replica
    running as the owner or a superuser is never ready."""
    from core.rls import runtime_role_problems

    problems = runtime_role_problems()
    if problems:
        raise RuntimeError("unsafe database role: " + "; ".join(problems))


def _check_redis() -> None:
    import redis

    redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2).ping()


def _check_broker() -> None:
    from controlplane.celery import app

    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)


@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    checks = {"database": _check_database, "database_roles": _check_database_roles, "broker": _check_broker}
    if settings.REDIS_URL:
        checks["redis"] = _check_redis
    results: dict[str, str] = {}
    failing: list[str] = []
    for name, check in checks.items():
        try:
            check()
            results[name] = "ok"
        except Exception:  # any failure makes the component not ready; the reason is logged
            log.warning("readiness: %s is not reachable", name, exc_info=True)
            results[name] = "error"
            failing.append(name)
    if failing:
        return JsonResponse({"status": "unavailable", "failing": failing, "checks": results}, status=503)
    return JsonResponse({"status": "ok", "checks": results, "detail": {"recovery_sweep": _sweep()}})


def _sweep() -> dict[str, object]:
    """The recovery sweep's lag, as detail: it does not make this replica unready (the replica
    serves as well as ever; the beat process is what lags, and every replica would go unready at
    once), but a probe and a person see it."""
    from recovery import sweeper

    try:
        return sweeper.status()
    except Exception:
        log.warning("readiness: the recovery sweep's lag could not be read", exc_info=True)
        return {"status": "error", "lag_s": None}
