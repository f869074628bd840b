"""The Celery app. In embedded mode the broker is kombu's filesystem transport under the data
folder, so `celery -A controlplane worker -B` runs with no server at all. Long tasks see a warm
shutdown through `core.shutdown.keep_going` (its signal receivers connect when this imports it)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals

import core.shutdown  # noqa: F401  (connects the warm-shutdown receivers behind keep_going)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_init.connect
@signals.beat_init.connect
def _refuse_unsafe_database_role(**kwargs: Any) -> None:
    """A worker or beat whose database role row-level security does not bind must not start
    (core/rls.py). SystemExit: Celery logs and ignores ordinary exceptions from receivers."""
    from django.core.exceptions import ImproperlyConfigured

    from core.rls import refuse_unsafe_runtime_role

    try:
        refuse_unsafe_runtime_role()
    except ImproperlyConfigured as exc:
        raise SystemExit(str(exc)) from exc


@signals.worker_process_init.connect
def _trace_tasks(**kwargs: Any) -> None:
    """Each pool process exports its own spans (an exporter's thread does not survive a fork)."""
    from controlplane.tracing import configure_tracing

    configure_tracing("sagaplane-worker")
