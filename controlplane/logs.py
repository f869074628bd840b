"""Structured logs: in production (or with SAGAPLANE_LOG_FORMAT=json) every line, ours and every
library's, is one JSON object with its time, level, logger, the request id of the request it
belongs to, the tenant whose context is active, and the OpenTelemetry trace id when one is
recording. Configured through settings.LOGGING (this module's `json_formatter`).

Nothing here imports a model: logging is configured before the app registry is ready. What a
line must never carry (credentials, key material) is kept out where it is produced: requests are
logged by path only (no query, no headers), invitation tokens in paths become references
(frontend.log_redaction), and settings never log their values."""

from __future__ import annotations

import logging
from typing import Any

import structlog


def add_tenant(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """The tenant whose context is active (inside a request's view or a task), if any."""
    if "tenant" not in event or not event["tenant"]:
        try:
            from core.scoping import current_tenant

            event["tenant"] = current_tenant().slug
        except Exception:
            event.pop("tenant", None)
    return event


def add_trace(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """The OpenTelemetry trace and span this line belongs to (when one is recording)."""
    try:
        from opentelemetry import trace
    except ImportError:  # pragma: no cover - a server dependency
        return event
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event["trace_id"] = format(context.trace_id, "032x")
        event["span_id"] = format(context.span_id, "016x")
    return event


def json_formatter() -> logging.Formatter:
    """The production log format: one JSON object per line (logging.config's "()" factory)."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_tenant,
        add_trace,
    ]
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
    )
