"""Export recovery: a build whose worker died is re-queued by the stale sweep, rebuilt (or its
published file adopted), and failed with a reason after SAGAPLANE_EXPORT_MAX_ATTEMPTS builds."""

from __future__ import annotations

import hashlib
import io
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from sagaplane.export import verify_export

from core.scoping import tenant_context
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.chains import Writer
from tests.support.factories import Person
from tests.support.processes import stop_group
from tests.support.scoping import in_tenant
from tests.support.transparency import settle
from transparency import services
from transparency import tasks as transparency_tasks
from transparency.actions import exports
from transparency.models import Export, ExportStatus
from transparency.storage import WriteOnceFileStorage, get_storage
from transparency.tasks import build_export_in


class WorkerKilled(BaseException):
    """Stands in for SIGKILL in-process: not an Exception, so no handler records a failure."""


@pytest.fixture(autouse=True)
def _private_storage(settings: Any, tmp_path: Path) -> None:
    settings.SAGAPLANE_EXPORT_STORAGE = {
        "BACKEND": "transparency.storage.WriteOnceFileStorage",
        "OPTIONS": {"location": str(tmp_path / "exports")},
    }
    settings.SAGAPLANE_EXPORT_STALE_MINUTES = 10
    settings.SAGAPLANE_EXPORT_MAX_ATTEMPTS = 3


@pytest.fixture
def eager() -> Any:
    from controlplane.celery import app

    previous, app.conf.task_always_eager = app.conf.task_always_eager, True
    yield
    app.conf.task_always_eager = previous


@pytest.fixture
def logged(tenant_a: Tenant, writer_a: Writer) -> Tenant:
    writer_a.saga("s1")
    Writer(tenant_a, "agent-a-2").saga("s2", steps=3)
    settle(tenant_a)
    return tenant_a


def _later(minutes: float = 11) -> Any:
    return timezone.now() + timedelta(minutes=minutes)


def _row(tenant: Tenant, export_id: Any) -> Export:
    with tenant_context(tenant):
        return Export.objects.get(pk=export_id)


def _queued(tenant: Tenant, capture: Any) -> Export:
    """A requested export whose message nobody has consumed yet."""
    with capture(execute=False):
        return in_tenant(services.request_export, tenant, actor=named_actor("test"))


def _vkey(tenant: Tenant) -> str:
    with tenant_context(tenant):
        return services.current_verifier_keys()[0]


def _verify(tenant: Tenant, export: Export, tmp_path: Path) -> None:
    path = tmp_path / f"{export.pk}.tar.gz"
    with get_storage().open(export.storage_name) as stored:
        path.write_bytes(stored.read())
    assert hashlib.sha256(path.read_bytes()).hexdigest() == export.sha256
    report = verify_export(str(path), _vkey(tenant))
    assert report.records == export.records_total > 0


def test_a_stale_running_export_is_requeued_and_rebuilt(
    logged: Tenant, django_capture_on_commit_callbacks: Any, eager: None, tmp_path: Path
) -> None:
    export = _queued(logged, django_capture_on_commit_callbacks)
    # A worker claimed it and died: the row says running, attempt 1, and nothing will change it.
    assert in_tenant(exports.claim_export, logged, export.pk) is not None
    assert _row(logged, export.pk).status == ExportStatus.RUNNING

    # Not stale yet: the sweep leaves a build that showed life recently alone.
    assert transparency_tasks.sweep_stale_exports() == {"requeued": [], "failed": []}

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        outcome = transparency_tasks.sweep_stale_exports(_later())
    assert outcome == {"requeued": [str(export.pk)], "failed": []}
    row = _row(logged, export.pk)
    assert (row.status, row.attempts) == (ExportStatus.QUEUED, 1)
    assert len(callbacks) == 1  # a new message, sent only once the re-queue committed

    callbacks[0]()  # the message reaches a (here eager) worker
    row = _row(logged, export.pk)
    assert (row.status, row.attempts, row.error) == (ExportStatus.DONE, 2, "")
    assert row.records_done == row.records_total
    _verify(logged, row, tmp_path)


def test_a_retry_builds_against_the_first_claims_checkpoint(
    logged: Tenant, writer_a: Writer, django_capture_on_commit_callbacks: Any, eager: None, tmp_path: Path
) -> None:
    export = _queued(logged, django_capture_on_commit_callbacks)
    first = in_tenant(exports.claim_export, logged, export.pk)
    assert first is not None
    writer_a.saga("s3")  # the log grows while the dead build sits there
    settle(logged)
    with django_capture_on_commit_callbacks(execute=True):
        transparency_tasks.sweep_stale_exports(_later())
    row = _row(logged, export.pk)
    assert row.status == ExportStatus.DONE
    assert (row.checkpoint_id, row.first, row.end) == (first.checkpoint.pk, first.first, first.end)
    _verify(logged, row, tmp_path)


def test_a_build_killed_after_publishing_is_adopted_not_rebuilt(
    logged: Tenant, django_capture_on_commit_callbacks: Any, eager: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = _queued(logged, django_capture_on_commit_callbacks)
    real_finish = services.finish_export

    def die_before_recording_done(*args: Any, **fields: Any) -> bool:
        if fields.get("status") == ExportStatus.DONE:
            raise WorkerKilled
        return real_finish(*args, **fields)

    monkeypatch.setattr(services, "finish_export", die_before_recording_done)
    with pytest.raises(WorkerKilled):
        build_export_in(logged, export.pk)
    monkeypatch.setattr(services, "finish_export", real_finish)
    name = services.export_storage_name(logged, export.pk)
    published = get_storage().open(name).read()
    assert _row(logged, export.pk).status == ExportStatus.RUNNING  # the file exists, the row lags

    with django_capture_on_commit_callbacks(execute=True):
        transparency_tasks.sweep_stale_exports(_later())
    row = _row(logged, export.pk)
    assert (row.status, row.attempts) == (ExportStatus.DONE, 2)
    # The retry adopted the published file (write-once: it could not have replaced it anyway).
    assert row.sha256 == hashlib.sha256(published).hexdigest()
    assert get_storage().open(name).read() == published


def test_a_build_killed_while_publishing_leaves_no_final_file(tmp_path: Path) -> None:
    storage = WriteOnceFileStorage(tmp_path / "exports")

    class Torn(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            if self.tell() > 0:
                raise WorkerKilled  # dies half-way through the copy
            return super().read(4)

    with pytest.raises(WorkerKilled):
        storage.create("t/x.tar.gz", Torn(b"0123456789"))
    assert not storage.exists("t/x.tar.gz")  # never a torn file under the final name
    storage.create("t/x.tar.gz", io.BytesIO(b"complete"))
    assert storage.open("t/x.tar.gz").read() == b"complete"
    assert [p.name for p in (tmp_path / "exports" / "t").iterdir()] == ["x.tar.gz"]
    with pytest.raises(FileExistsError):
        storage.create("t/x.tar.gz", io.BytesIO(b"overwrite"))


def test_a_replaced_build_cannot_write_over_its_successor(
    logged: Tenant, django_capture_on_commit_callbacks: Any, eager: None
) -> None:
    export = _queued(logged, django_capture_on_commit_callbacks)
    zombie = in_tenant(exports.claim_export, logged, export.pk)
    assert zombie is not None and zombie.attempt == 1
    with django_capture_on_commit_callbacks(execute=True):
        transparency_tasks.sweep_stale_exports(_later())
    done = _row(logged, export.pk)
    assert (done.status, done.attempts) == (ExportStatus.DONE, 2)
    # The first worker was only slow, not dead: its late writes are fenced off by its attempt.
    in_tenant(services.record_export_progress, logged, export.pk, zombie.attempt, 1, 99)
    assert not in_tenant(
        services.finish_export, logged, export.pk, zombie.attempt, status=ExportStatus.FAILED
    )
    after = _row(logged, export.pk)
    assert (after.status, after.records_total, after.sha256) == (
        ExportStatus.DONE,
        done.records_total,
        done.sha256,
    )


def test_gives_up_with_a_reason_after_max_attempts(
    logged: Tenant, django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.SAGAPLANE_EXPORT_MAX_ATTEMPTS = 2
    export = _queued(logged, django_capture_on_commit_callbacks)
    for attempt in (1, 2):
        claim = in_tenant(exports.claim_export, logged, export.pk)
        assert claim is not None and claim.attempt == attempt
        with django_capture_on_commit_callbacks(execute=False):
            outcome = transparency_tasks.sweep_stale_exports(_later(11 * attempt))
        expected = "requeued" if attempt == 1 else "failed"
        assert outcome[expected] == [str(export.pk)]
    row = _row(logged, export.pk)
    assert row.status == ExportStatus.FAILED and row.finished_at is not None
    assert "gave up after 2 attempt(s)" in row.error and "progress" in row.error
    # Failed is final: later sweeps leave it alone.
    assert transparency_tasks.sweep_stale_exports(_later(60)) == {"requeued": [], "failed": []}


def test_a_lost_queued_message_is_resent_without_costing_an_attempt(
    logged: Tenant, django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.SAGAPLANE_EXPORT_MAX_ATTEMPTS = 1
    export = _queued(logged, django_capture_on_commit_callbacks)
    for minutes in (11, 22, 33):
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            assert transparency_tasks.sweep_stale_exports(_later(minutes))["requeued"] == [str(export.pk)]
        assert len(callbacks) == 1
    row = _row(logged, export.pk)
    assert (row.status, row.attempts) == (ExportStatus.QUEUED, 0)


def test_recent_progress_keeps_a_long_build_alive(
    logged: Tenant, django_capture_on_commit_callbacks: Any
) -> None:
    export = _queued(logged, django_capture_on_commit_callbacks)
    claim = in_tenant(exports.claim_export, logged, export.pk)
    assert claim is not None
    with tenant_context(logged):
        Export.objects.filter(pk=export.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=30))
    in_tenant(services.record_export_progress, logged, export.pk, claim.attempt, 5, 10)  # a chunk was written
    assert transparency_tasks.sweep_stale_exports() == {"requeued": [], "failed": []}


@pytest.mark.slow  # a Redis of its own (redis-server), so no `redis` marker: it runs on SQLite too
def test_the_sweep_is_on_the_beat(tmp_path: Path) -> None:
    """A real `celery -A controlplane beat`, on a Redis of the test's own, sends the sweep task
    on its schedule (shortened to a second here); its messages are read off the broker's queue."""
    import json

    import redis

    from controlplane.celery import app
    from tests.hostile.production import VENV_BIN, own_redis

    with own_redis(tmp_path) as broker:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DJANGO_", "SAGAPLANE_", "DB_", "DATABASE_", "CELERY_"))
        }
        env.update(
            {
                "REDIS_URL": broker.url,
                "SAGAPLANE_DATA_DIR": str(tmp_path / "beat-data"),
                "SAGAPLANE_EXPORT_SWEEP_SECONDS": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        log = tmp_path / "beat.log"
        with log.open("w") as out:
            beat = subprocess.Popen(
                [str(VENV_BIN / "celery"), "-A", "controlplane", "beat", "--loglevel=INFO"],
                cwd=Path(__file__).resolve().parents[2],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        sent: list[str] = []
        try:
            queue = redis.Redis.from_url(broker.url, socket_timeout=150)
            # Blocking pops, oldest first; bounded by the number of messages and by each wait.
            while "transparency.sweep_stale_exports" not in sent and len(sent) < 200:
                popped = queue.brpop(["celery"], timeout=120)
                assert popped is not None, f"beat sent nothing more after {sent}:\n{log.read_text()[-3000:]}"
                sent.append(json.loads(popped[1])["headers"]["task"])
            # Stopped as an orchestrator stops it. Its exit status is not asserted: celery beat's
            # own SIGTERM handling ends with 0, 1 (its schedule shelf closed under its service
            # thread) or the signal's status depending on timing; the schedule is what matters.
            beat.send_signal(signal.SIGTERM)
            beat.wait(timeout=60)
        finally:
            stop_group(beat)
    assert "transparency.sweep_stale_exports" in sent, sent
    # What it sends is a task a worker knows (registered when the worker imports the tasks).
    from transparency import tasks

    assert app.tasks["transparency.sweep_stale_exports"].run is tasks.sweep_stale_exports.run


# ------------------------------------------------------------------ a real worker, really killed

WORKER = textwrap.dedent(
    """
    import os, sys, threading
    import django

    os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    django.setup()
    from celery.signals import task_postrun
    from transparency import sources

    queue, mode, fd = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def blocking_records(tenant, start, end):
        os.write(fd, b"B")        # the build is under way: tell the test...
        threading.Event().wait()  # ...and hang here until SIGKILL
        yield from ()

    if mode == "block":
        sources.records = blocking_records
    else:
        task_postrun.connect(lambda **kw: os.write(fd, b"D"), weak=False)

    from controlplane.celery import app

    app.worker_main(["worker", "--pool=solo", "-Q", queue, "-l", "WARNING",
                     "--without-heartbeat", "--without-gossip", "--without-mingle"])
    """
)


def _read_signal(fd: int, timeout: float = 120) -> bytes:
    ready, _, _ = select.select([fd], [], [], timeout)
    assert ready, "the worker never reached the expected point"
    return os.read(fd, 1)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_sigkilled_worker_then_sweep_then_new_worker_completes(
    logged: Tenant, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    from django.db import connection

    from transparency.tasks import build_export

    queue = f"test-export-{uuid.uuid4().hex[:12]}"  # no other worker on this broker may take it
    monkeypatch.setattr(
        exports,
        "_enqueue_export",
        lambda export: build_export.apply_async((str(export.pk), export.tenant_id), queue=queue),
    )
    db = connection.settings_dict
    env = {
        **{
            k: v for k, v in os.environ.items() if k != "DATABASE_OWNER_URL"
        },  # a worker: the runtime role only
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "SAGAPLANE_EXPORT_DIR": settings.SAGAPLANE_EXPORT_STORAGE["OPTIONS"]["location"],
        "CELERY_TASK_ALWAYS_EAGER": "false",
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    script = tmp_path / "worker.py"
    script.write_text(WORKER)

    def worker(mode: str) -> tuple[subprocess.Popen, int]:
        read_fd, write_fd = os.pipe()
        proc = subprocess.Popen(
            [sys.executable, str(script), queue, mode, str(write_fd)],
            pass_fds=(write_fd,),
            env=env,
            cwd=Path(__file__).resolve().parents[2],
        )
        os.close(write_fd)
        return proc, read_fd

    doomed, doomed_fd = worker("block")
    try:
        export = in_tenant(
            services.request_export, logged, actor=named_actor("test")
        )  # committed: message sent
        assert _read_signal(doomed_fd) == b"B"
        row = _row(logged, export.pk)
        assert (row.status, row.attempts) == (ExportStatus.RUNNING, 1)
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=30)
    finally:
        if doomed.poll() is None:
            doomed.kill()
        os.close(doomed_fd)
    assert _row(logged, export.pk).status == ExportStatus.RUNNING  # stuck, as before this fix

    assert transparency_tasks.sweep_stale_exports(_later())["requeued"] == [str(export.pk)]
    rescuer, rescuer_fd = worker("complete")
    try:
        assert _read_signal(rescuer_fd) == b"D"  # the rescuer finished a task
        row = _row(logged, export.pk)
    finally:
        rescuer.send_signal(signal.SIGTERM)
        try:
            rescuer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rescuer.kill()
        os.close(rescuer_fd)
    assert (row.status, row.attempts, row.error) == (ExportStatus.DONE, 2, "")
    _verify(logged, row, tmp_path)


# ---------------------------------------------------------------- the broker is down at request


@pytest.fixture
def unreachable_broker() -> Any:
    """Celery publishes to a Redis address nothing listens on (connection refused), as when the
    broker is down; the previous broker and its cached connection pools are restored after."""
    from controlplane.celery import app

    with socket.socket() as probe:  # a port that was free a moment ago: nothing answers on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conf = app.conf
    producers = (app._pool, app.amqp._producer_pool)
    saved = (conf.broker_url, conf.broker_transport, conf.task_always_eager, *producers)
    conf.broker_url = f"redis://127.0.0.1:{port}/0"
    conf.broker_transport = None  # the embedded defaults name their transport, which beats the URL's
    conf.task_always_eager = False
    app._pool = app.amqp._producer_pool = None
    yield
    if app._pool is not None:
        app._pool.force_close_all()
    conf.broker_url, conf.broker_transport, conf.task_always_eager, app._pool, app.amqp._producer_pool = saved


@pytest.mark.django_db(transaction=True)
def test_an_export_request_answers_202_when_the_broker_is_down(
    alice: Person, unreachable_broker: None, caplog: pytest.LogCaptureFixture
) -> None:
    client = alice.session_client()
    with caplog.at_level("WARNING", logger="core.postcommit"):
        response = client.post("/api/v1/audit/exports", {}, format="json")
    assert response.status_code == 202, response.content
    # The request committed: the row waits for the stale sweep to send its message again.
    row = _row(alice.tenant, response.json()["id"])
    assert (row.status, row.attempts) == (ExportStatus.QUEUED, 0)
    assert f"queue export {row.pk} failed" in caplog.text  # the publish really was refused
    assert transparency_tasks.sweep_stale_exports(_later())["requeued"] == [str(row.pk)]
