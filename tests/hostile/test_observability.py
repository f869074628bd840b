"""Observability of a real production deployment: gunicorn with two uvicorn workers (the
README's command with infra/gunicorn.conf.py), a Celery worker, their own Redis and Postgres, an
agent in its own process shipping with the SDK under OpenTelemetry, and a local stand-in for an
OpenTelemetry collector speaking OTLP/HTTP (protobuf), as a real collector would receive it.

One run, four answers: one trace runs from the agent's batch through the ingest request to the
Celery task that signs the checkpoint covering it; /metrics counts every worker's batches
whichever worker answers the scrape; every log line of the server and the worker is JSON with
the request id, tenant, actor and trace id where they apply; and no secret the deployment was
given (secret key, master key, API key, metrics token, passwords, the log's signing key) appears
in any of its logs."""

from __future__ import annotations

import base64
import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from tests.hostile.production import ROOT, VENV_BIN, control_plane, own_database, own_redis, pg_execute
from tests.support.processes import stop_group
from tests.support.production_env import production_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

DEADLINE = 60.0
SDK_ROOT = ROOT / "sdk"


class Collector:
    """Receives OTLP/HTTP trace exports (POST /v1/traces, protobuf) and keeps every span."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                outer.receive(raw)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def receive(self, raw: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(raw)
        found = []
        for resource_spans in request.resource_spans:
            service = next(
                (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"),
                "",
            )
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {}
                    for a in span.attributes:
                        value = a.value
                        kind = value.WhichOneof("value")
                        if kind == "array_value":
                            attributes[a.key] = [v.string_value for v in value.array_value.values]
                        elif kind is not None:
                            attributes[a.key] = getattr(value, kind)
                    found.append(
                        {
                            "service": service,
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_id": span.parent_span_id.hex(),
                            "attributes": attributes,
                        }
                    )
        with self.lock:
            self.spans.extend(found)

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def scrape_warnings(log: Path) -> list[str]:
    """The web's own word on a scrape source that failed (logged with its traceback)."""
    lines = log.read_text(errors="replace").splitlines()
    return [line for line in lines if "metrics:" in line or "Error" in line][-20:]


@contextmanager
def celery_worker(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[Any]]:
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(VENV_BIN / "celery"), "-A", "controlplane", "worker", "--concurrency=1", "--pool=prefork"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        stop_group(process, first=signal.SIGTERM)  # warm shutdown: the exporter flushes at exit


AGENT = """
import json, sys
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
import sagaplane as sp

provider = TracerProvider(resource=Resource.create({"service.name": "test-agent"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1] + "/v1/traces")))
trace.set_tracer_provider(provider)
wal = sp.WAL(sys.argv[2], fsync=False)
with sp.saga(name="observed", wal=wal) as saga:
    pass
shipper = sp.Shipper(wal.path, url=sys.argv[3], api_key=sys.argv[4])
shipped = shipper.run_until_caught_up(max_retries=20)
provider.shutdown()
print(json.dumps({"shipped": shipped, "traceparent": shipper.last_traceparent, "saga_id": saga.saga_id}))
"""


def metric(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def checkpoint_size(client: httpx.Client) -> int:
    answer = client.get("/api/v1/audit/checkpoint")
    return int(answer.text.splitlines()[1]) if answer.status_code == 200 else 0


def test_one_trace_metrics_across_workers_json_logs_and_no_secret_logged(tmp_path: Path) -> None:
    collector = Collector()
    metrics_token = "metrics-" + uuid.uuid4().hex
    try:
        with own_redis(tmp_path) as redis, own_database() as db:
            env = production_env(
                db.url,
                redis.url,
                tmp_path / "data",
                SAGAPLANE_METRICS_TOKEN=metrics_token,
                SECURE_SSL_REDIRECT="false",  # the agent speaks plain http to loopback
                LOG_LEVEL="DEBUG",  # the most the deployment can say, for the secret check
                OTEL_EXPORTER_OTLP_ENDPOINT=collector.url,
                OTEL_BSP_SCHEDULE_DELAY="100",
            )
            (tmp_path / "data").mkdir()
            with control_plane(env, workers=2) as server:
                with celery_worker(env, tmp_path / "worker.log") as worker:

                    def lag() -> float | None:
                        answer = httpx.get(
                            f"{server.url}/metrics",
                            headers={"Authorization": f"Bearer {metrics_token}"},
                            timeout=10,
                        )
                        assert answer.status_code == 200
                        text = answer.text
                        if metric(text, "sagaplane_scrape_errors", source="integration_lag"):
                            return None
                        return metric(text, "sagaplane_integration_lag_leaves")

                    # The set-up's own records (tenant and key creation) are integrated first, by
                    # the task their commands queued; integration requests coalesce per tenant, so
                    # the agent's batch then queues a task of its own.
                    wait_until(
                        lambda: lag() == 0,
                        "the set-up's records under a checkpoint",
                        deadline=DEADLINE,
                        every=0.1,
                    )
                    agent = subprocess.run(
                        [
                            sys.executable,
                            "-c",
                            AGENT,
                            collector.url,
                            str(tmp_path / "agent.wal"),
                            server.url,
                            server.api_key,
                        ],
                        capture_output=True,
                        text=True,
                        timeout=120,
                        env={**os.environ, "PYTHONPATH": str(SDK_ROOT)},
                    )
                    assert agent.returncode == 0, agent.stderr
                    shipped = json.loads(agent.stdout.strip().splitlines()[-1])
                    assert shipped["shipped"] == 2  # SAGA_START and SAGA_COMPLETE
                    trace_id = shipped["traceparent"].split("-")[1]
                    # The worker signs a checkpoint covering the batch (no beat runs here: only
                    # the task the ingest request queued can integrate it).
                    wait_until(
                        lambda: lag() == 0, "the batch under a checkpoint", deadline=DEADLINE, every=0.1
                    )
                    with server.client(timeout=10) as client:
                        assert checkpoint_size(client) >= 2

                    # 1. One trace: the agent's batch, the ingest request, the task that signed.
                    def whole_trace() -> list[dict[str, Any]] | None:
                        spans = collector.trace(trace_id)
                        names = {s["name"] for s in spans}
                        return spans if "run/transparency.integrate_tenant" in names else None

                    spans = wait_until(
                        whole_trace,
                        "the integration task's span in the agent's trace",
                        deadline=DEADLINE,
                        every=0.1,
                        context=lambda: [(s["service"], s["name"], s["trace_id"]) for s in collector.spans],
                    )
                    by_name = {s["name"]: s for s in spans}
                    ship = by_name["sagaplane.ship"]
                    assert ship["service"] == "test-agent"
                    assert ship["attributes"]["sagaplane.saga_ids"] == [shipped["saga_id"]]
                    served = [s for s in spans if s["parent_id"] == ship["span_id"]]
                    assert [s["service"] for s in served] == ["sagaplane-web"], spans
                    # The web's request (the sealer's own request for its seal's signing, made
                    # in the worker, may join the trace too).
                    (published,) = [
                        s
                        for s in spans
                        if s["name"] == "apply_async/transparency.integrate_tenant"
                        and s["service"] == "sagaplane-web"
                    ]
                    ran = [s for s in spans if s["parent_id"] == published["span_id"]]
                    assert [(s["name"], s["service"]) for s in ran] == [
                        ("run/transparency.integrate_tenant", "sagaplane-worker")
                    ]

                    # 2. Every worker's counts, whichever worker answers the scrape.
                    records = 2
                    for n in range(8):
                        with httpx.Client(base_url=server.url, timeout=10) as fresh:
                            body = {"records": [{"bad": n}]}
                            headers = {"Authorization": f"Bearer {server.api_key}"}
                            assert (
                                fresh.post(
                                    "/api/v1/streams/noise/records", json=body, headers=headers
                                ).status_code
                                == 400
                            )
                    scrapes = []
                    for _ in range(8):
                        with httpx.Client(base_url=server.url, timeout=10) as fresh:
                            answer = fresh.get(
                                "/metrics", headers={"Authorization": f"Bearer {metrics_token}"}
                            )
                            assert answer.status_code == 200
                            scrapes.append(answer.text)
                        assert httpx.get(f"{server.url}/metrics", timeout=10).status_code == 404  # no token
                    for text in scrapes:
                        assert metric(text, "sagaplane_ingest_records_total", outcome="accepted") == records
                        assert (
                            metric(
                                text, "sagaplane_ingest_batches_total", outcome="refused", reason="invalid"
                            )
                            == 8
                        )
                        assert metric(text, "sagaplane_integration_lag_leaves") == 0
                        # Read as the runtime role, through the apps' count-only functions.
                        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
                        failed = [
                            s.labels for s in samples if s.name == "sagaplane_scrape_errors" and s.value
                        ]
                        assert failed == [], (failed, scrape_warnings(server.log))
                        queues = {s.labels["queue"] for s in samples if s.name == "sagaplane_queue_depth"}
                        wanted = {"approvals_pending", "recovery_escalated", "reconciliation_checks_open"}
                        assert wanted <= queues, queues
                    worker.send_signal(signal.SIGTERM)
                    worker.wait(timeout=60)
                api_key = server.api_key
                server_log = server.log
            seeds = pg_execute(db.owner_url, "SELECT encrypted_seed FROM transparency_logsigningkey")
            assert seeds, "the tenant's log has a signing key"
            master = Fernet(env["SAGAPLANE_MASTER_KEY"].encode())
            seed_forms = []
            for (encrypted,) in seeds:
                seed = master.decrypt(encrypted.encode())
                seed_forms += [
                    seed.hex(),
                    base64.b64encode(seed).decode(),
                    base64.urlsafe_b64encode(seed).decode(),
                ]
    finally:
        collector.close()

    # 3. Structured logs: every line our code or a library wrote through logging is one JSON object.
    logs = {"web": server_log.read_text(errors="replace"), "worker": (tmp_path / "worker.log").read_text()}
    entries: dict[str, list[dict[str, Any]]] = {}
    for name, text in logs.items():
        entries[name] = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert entries[name], f"no JSON log line from the {name}"
    ingest = [
        e for e in entries["web"] if e.get("http_route") == "stream-records" and e.get("http_status") == 200
    ]
    assert ingest, "the ingest request was logged"
    line = ingest[0]
    assert line["level"] == "info" and line["tenant"] == "hostile" and line["actor"].startswith("api-key:")
    assert line["trace_id"] == trace_id and len(line["request_id"]) == 32
    assert any(e.get("trace_id") == trace_id for e in entries["worker"]) or any(
        "integrate" in e.get("event", "") for e in entries["worker"]
    )

    # 4. No secret reaches a log.
    secrets = {
        "SECRET_KEY": env["SECRET_KEY"],
        "SAGAPLANE_MASTER_KEY": env["SAGAPLANE_MASTER_KEY"],
        "the API key": api_key,
        "the API key's secret part": api_key.rsplit("_", 1)[-1],
        "SAGAPLANE_METRICS_TOKEN": metrics_token,
        "the owner's password": "hostile-owner-password",
        "DATABASE_URL": env["DATABASE_URL"],
        **{f"signing key ({n})": form for n, form in enumerate(seed_forms)},
    }
    for log_name, text in logs.items():
        leaked = [name for name, secret in secrets.items() if secret and secret in text]
        assert leaked == [], f"the {log_name} log holds {leaked}"
