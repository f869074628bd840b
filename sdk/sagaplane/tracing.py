"""W3C trace context for the batches the shipper sends, so one trace runs from an agent's batch
through the control plane's ingest to the task that signs the checkpoint covering it.

Works with or without OpenTelemetry:
- With `opentelemetry-api` installed and a tracer provider configured by the agent, each batch
  is a span (`sagaplane.ship`, a client span) in the agent's own tracing, carrying the stream, the
  record count and the saga ids in the batch (`sagaplane.saga_ids`), and its context goes out as
  the `traceparent` header.
- Without it (or with no provider configured), the SDK still sends a fresh, valid `traceparent`
  per batch, so the control plane's logs and traces of that batch share one trace id that the
  agent can log (`Shipper.last_traceparent`).

Nothing here is needed for shipping to work: any failure in tracing leaves the batch untouched.
"""

from __future__ import annotations

import contextvars
import re
import secrets
from collections.abc import Iterable
from typing import Any

try:  # optional: the SDK has no dependencies of its own
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - exercised by the tests that hide the package
    _trace = None  # type: ignore[assignment]
    _propagate = None  # type: ignore[assignment]

_SAGA_ID = re.compile(rb'"saga_id"\s*:\s*"((?:[^"\\]|\\.){1,128})"')
MAX_SAGA_IDS = 32  # a span attribute, not an index: enough to find the sagas of a batch


def new_traceparent() -> str:
    """A W3C traceparent for a new trace (version 00, sampled)."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def saga_ids(lines: Iterable[bytes]) -> list[str]:
    """The distinct saga ids named by these WAL lines, in order, at most MAX_SAGA_IDS (read with a
    pattern, not a JSON parse: a batch is never decoded just to be traced)."""
    seen: dict[str, None] = {}
    for line in lines:
        match = _SAGA_ID.search(line)
        if match is None:
            continue
        try:
            seen.setdefault(match.group(1).decode("utf-8"), None)
        except UnicodeDecodeError:
            continue
        if len(seen) >= MAX_SAGA_IDS:
            break
    return list(seen)


class BatchSpan:
    """One batch on its way: `headers` go with the request; `end(status)` closes the span."""

    def __init__(self, span: Any, headers: dict[str, str]) -> None:
        self._span = span
        self.headers = headers

    @property
    def traceparent(self) -> str:
        return self.headers.get("traceparent", "")

    def end(self, status: int | None, error: str | None = None) -> None:
        span, self._span = self._span, None
        if span is None:
            return
        try:
            if status is not None:
                span.set_attribute("http.response.status_code", status)
            if error is not None or (status is not None and status >= 400):
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR, error or f"HTTP {status}"))
            span.end()
        except Exception:  # tracing never breaks shipping
            pass


def start_batch(stream_id: str, lines: list[bytes]) -> BatchSpan:
    """Open the span of one batch (when OpenTelemetry is recording) and the headers that carry it."""
    if _trace is not None and _propagate is not None:
        try:
            tracer = _trace.get_tracer("sagaplane")
            span = tracer.start_span("sagaplane.ship", kind=_trace.SpanKind.CLIENT)
            if span.is_recording():
                span.set_attribute("sagaplane.stream_id", stream_id)
                span.set_attribute("sagaplane.records", len(lines))
                ids = saga_ids(lines)
                if ids:
                    span.set_attribute("sagaplane.saga_ids", ids)
                headers: dict[str, str] = {}
                _propagate.inject(headers, context=_trace.set_span_in_context(span))
                if headers.get("traceparent"):
                    return BatchSpan(span, headers)
            span.end()
        except Exception:
            pass
    return BatchSpan(None, {"traceparent": new_traceparent()})


class SagaSpan:
    """A saga's span, current in the context that began the saga. A saga left from another
    context (an MCP gateway's saga spans several requests, each a task of its own) ends its span
    without detaching a context that is not this one's."""

    def __init__(self, span: Any) -> None:
        self.span = span
        self._token: Any = None
        self._marker = object()
        self._mark_token: Any = None

    def __enter__(self) -> SagaSpan:
        from opentelemetry import context

        self._token = context.attach(_trace.set_span_in_context(self.span))
        self._mark_token = _saga_context.set(self._marker)
        return self

    def __exit__(self, *exc: object) -> None:
        from opentelemetry import context

        if _saga_context.get() is self._marker:
            _saga_context.reset(self._mark_token)
            context.detach(self._token)
        self.span.end()


_saga_context: contextvars.ContextVar[object] = contextvars.ContextVar("sagaplane_saga_span", default=None)


def saga_span(name: str, saga_id: str) -> SagaSpan | None:
    """A span for a saga run in the agent (a context manager), or None without OpenTelemetry."""
    if _trace is None:
        return None
    try:
        span = _trace.get_tracer("sagaplane").start_span(
            f"saga {name}", attributes={"sagaplane.saga_id": saga_id, "sagaplane.saga_name": name}
        )
        return SagaSpan(span)
    except Exception:
        return None


class ToolSpan:
    """One governed tool call as an OpenTelemetry span (GenAI semantic conventions: operation
    `execute_tool`, `gen_ai.tool.name`, `gen_ai.tool.call.id`), with the saga and step ids and the
    gate's decision. Made only when the agent's tracer provider records (`tool_span`)."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def end(self, decision: str, state: str, error: BaseException | None = None) -> None:
        span, self._span = self._span, None
        if span is None:
            return
        try:
            span.set_attribute("sagaplane.gate.decision", decision or "ungoverned")
            span.set_attribute("sagaplane.step.state", state)
            if error is not None:
                from opentelemetry.trace import Status, StatusCode

                span.set_attribute("error.type", type(error).__name__)
                span.set_status(Status(StatusCode.ERROR, str(error)[:500]))
            span.end()
        except Exception:  # tracing never fails a step
            pass


def tool_span(
    tool: str, call_id: str, saga_id: str, step_id: str, semantics: str, parent: SagaSpan | None = None
) -> ToolSpan | None:
    """The span of one tool call (a child of its saga's span, else of the current one), or None
    when OpenTelemetry is absent or the agent configured no tracer provider (nothing recorded)."""
    if _trace is None:
        return None
    try:
        context = _trace.set_span_in_context(parent.span) if parent is not None else None
        span = _trace.get_tracer("sagaplane").start_span(
            f"execute_tool {tool}",
            context=context,
            kind=_trace.SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
                "sagaplane.saga_id": saga_id,
                "sagaplane.step_id": step_id,
                "sagaplane.semantics": semantics,
            },
        )
        if not span.is_recording():
            return None
        return ToolSpan(span)
    except Exception:
        return None
