"""The Prometheus metrics every process may record, and the few gauges computed when scraped.

Counters and histograms are recorded where things happen (the request middleware in
`controlplane.observability` sees every ingest batch and gate decision by its answer, so the
apps need no metrics code). Under gunicorn, `PROMETHEUS_MULTIPROC_DIR` (set by
infra/gunicorn.conf.py before the workers start) makes prometheus-client write each worker's
values to files that `/metrics` adds up, so every worker counts whichever one answers the scrape.

What is state rather than an event (integration lag, queue depths) is read when `/metrics` is
scraped, from sources apps register here in their `AppConfig.ready` (`register_gauge`): an app
that has a queue worth watching (approvals, recovery) adds one line, and this module imports no
app. The names are `sagaplane_*`; labels take values from fixed sets only (a reason outside
`REASON` becomes "other"), so no client can grow the series count.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import Counter, Histogram

REASON = re.compile(r"[a-z][a-z0-9_]{0,39}\Z")

INGEST_RECORDS = Counter(
    "sagaplane_ingest_records",
    "Records in ingest batches the control plane answered 2xx: accepted (appended) or duplicate "
    "(already held, acknowledged again)",
    ["outcome"],
)
INGEST_BATCHES = Counter(
    "sagaplane_ingest_batches",
    "Ingest batches by outcome (accepted / refused) and reason (the answer's reason or error code)",
    ["outcome", "reason"],
)
INGEST_SECONDS = Histogram(
    "sagaplane_ingest_batch_seconds",
    "Time to answer one ingest batch, from the request's arrival to its answer",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
GATE_DECISIONS = Counter(
    "sagaplane_gate_decisions",
    "Gate answers by decision (allow / deny / pending_approval / error) and reason",
    ["decision", "reason"],
)
HTTP_RESPONSES = Counter(
    "sagaplane_http_responses",
    "Answers by status class (2xx, 3xx, 4xx, 5xx)",
    ["status"],
)


def reason_label(value: object, fallback: str) -> str:
    return value if isinstance(value, str) and REASON.match(value) else fallback


# ----------------------------------------------------------------------- read when scraped


@dataclass(frozen=True)
class GaugeSource:
    name: str  # sagaplane_<name>
    documentation: str
    read: Callable[[], Iterable[tuple[dict[str, str], float]]]  # (labels, value) per series
    labels: tuple[str, ...] = ()


_sources: dict[str, GaugeSource] = {}


def register_gauge(
    name: str,
    documentation: str,
    read: Callable[[], Iterable[tuple[dict[str, str], float]]],
    *,
    labels: tuple[str, ...] = (),
) -> None:
    """Add a gauge that `/metrics` reads when scraped (registering a name again replaces it)."""
    _sources[name] = GaugeSource(name, documentation, read, labels)


def register_queue(name: str, depth: Callable[[], int]) -> None:
    """A work queue whose depth on-call wants to see (approvals waiting, recoveries pending):
    reported as sagaplane_queue_depth{queue=name}."""
    register_queues(name, lambda: {name: depth()})


def register_queues(source: str, depths: Callable[[], Mapping[str, int]]) -> None:
    """Several queues read by one question (one count query for all of an app's queues): each
    reported as sagaplane_queue_depth{queue=<key>}. The keys are fixed names chosen by the app,
    never tenant identities; if the read fails, sagaplane_scrape_errors{source="queue:<source>"}."""
    _queues[source] = depths


_queues: dict[str, Callable[[], Mapping[str, int]]] = {}


def gauge_sources() -> list[GaugeSource]:
    return list(_sources.values())


def queues() -> dict[str, Callable[[], Mapping[str, int]]]:
    return dict(_queues)
