"""OpenTelemetry traces for Django requests and Celery tasks (publishing and running), exported
over OTLP/HTTP to what the standard `OTEL_EXPORTER_OTLP_*` variables name; `OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_*` and the rest of the standard variables apply as usual.

Off by default: on only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set,
`OTEL_TRACES_EXPORTER` is unset or `otlp`, and `OTEL_SDK_DISABLED` is not `true`. A request that
arrives with a W3C `traceparent` (the SDK sends one with each batch) continues that trace, and a
task published while handling it (the integration that signs the checkpoint) continues it too."""

from __future__ import annotations

import os
from collections.abc import Mapping


def tracing_configured(environ: Mapping[str, str] = os.environ) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() not in ("otlp", ""):
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


_tracing_on = False


def configure_tracing(service: str) -> bool:
    """Trace Django requests and Celery tasks (publishing and running) over OTLP/HTTP, when
    `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set. Idempotent per process;
    call after fork (gunicorn workers import the application after forking; Celery's pool
    processes call it from `worker_process_init`). `OTEL_SERVICE_NAME` overrides `service`."""
    global _tracing_on
    if _tracing_on or not tracing_configured():
        return _tracing_on
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or service})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    CeleryInstrumentor().instrument()
    _tracing_on = True
    return True
