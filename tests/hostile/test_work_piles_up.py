"""Work must not pile up: a burst of batches queues one integration per tenant (it used to queue
one per batch: 1,559 after a fault run), and a worker asked to stop in the middle of a long
integration stops between chunks instead of holding Celery's warm shutdown until it is done."""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from audit.models import Record
from core.scoping import tenant_context
from tenants.models import Tenant
from tests.support.chains import Writer
from tests.support.processes import stop_group
from transparency import tasks as transparency_tasks
from transparency.models import Checkpoint, TreeState
from transparency.tasks import integrate_tenant, seal_tenant

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
DEFAULT_QUEUE = "celery"


def _broker() -> Any:
    from controlplane.celery import app

    return app.connection_for_write()


def _queued(queue: str = DEFAULT_QUEUE) -> list[dict[str, Any]]:
    """The messages waiting in a queue of this test run's own Redis database, oldest first."""
    with _broker() as conn:
        raw = conn.default_channel.client.lrange(queue, 0, -1)
    return [json.loads(item) for item in reversed(raw)]  # kombu pushes on the left


def _purge(queue: str = DEFAULT_QUEUE) -> None:
    with _broker() as conn:
        conn.default_channel.client.delete(queue)


def _run_like_a_worker(message: dict[str, Any]) -> Any:
    task = {"transparency.integrate_tenant": integrate_tenant, "transparency.seal_tenant": seal_tenant}
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    return task[message["headers"]["task"]](*args, **kwargs)


def _catch_up(tenant: Tenant) -> None:
    """Creating the tenant wrote server records, which requested an integration: run it as a
    worker would, so the test starts with nothing queued or requested. Messages other tests left
    in the queue (for tenants their rollback removed; no worker runs in tests) are dropped."""
    _purge()
    seal_tenant(tenant.pk)
    integrate_tenant(tenant.pk)
    _purge()


def _tree(tenant: Tenant) -> tuple[int, int, int]:
    """(leaves in the log, leaves in the tree, leaves under the latest signed checkpoint)."""
    with tenant_context(tenant):
        latest = Checkpoint.objects.order_by("-id").first()
        return (
            Record.objects.count(),
            TreeState.objects.values_list("size", flat=True).first() or 0,
            latest.size if latest else 0,
        )


@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_200_batches_queue_one_integration_one_sealing_and_everything_integrates(tenant_a: Tenant) -> None:
    _catch_up(tenant_a)
    try:
        writer = Writer(tenant_a, "agent-burst")
        for n in range(200):
            writer.saga(f"burst-{n}", steps=1)  # committed: its post-commit hook ran
        waiting = _queued()
        # One of each worker's tasks, however many batches: the sealer's and the integrator's.
        tasks = sorted(m["headers"]["task"] for m in waiting)
        assert tasks == ["transparency.integrate_tenant", "transparency.seal_tenant"], tasks[:5]

        # The sealer first: its request for the seals' signing finds the integration's standing
        # (the queue is read, not consumed, here: nothing new joins the two).
        for message in sorted(waiting, key=lambda m: m["headers"]["task"] != "transparency.seal_tenant"):
            _run_like_a_worker(message)
        assert len(_queued()) == 2
        log_size, tree_size, signed = _tree(tenant_a)
        assert log_size >= 200 * 4 + 200  # every record, and a seal for each finished saga
        assert signed == tree_size == log_size

        # The task took the request: the next batch asks again.
        _purge()
        writer.saga("after", steps=1)
        assert len(_queued()) == 2
    finally:
        _purge()


# ------------------------------------------------------------------ a real worker, told to stop

LEAVES = 2_000
CHUNK = 100  # leaves per integration transaction: 20 of them to integrate everything
SHUTDOWN_BOUND_S = 60.0  # a hang guard only: the worker stops at the end of the first chunk

# The worker, with one hook: after the first chunk is committed and signed, the pool process tells
# the test ("B") and holds there until the worker is asked to shut down. So the SIGTERM always
# arrives mid-integration with exactly one chunk done, however fast or slow the machine is, and a
# worker that did not stop between chunks would go on to integrate all of them.
WORKER = textwrap.dedent(
    """
    import os, sys
    import django

    os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    django.setup()
    from controlplane.celery import app
    from core.shutdown import keep_going
    from tests.support.waiting import wait_until
    from transparency import services, tasks

    queue, fd = sys.argv[1], int(sys.argv[2])
    one_round = services.integrate_round  # one round (chunk) of integrate_fully
    rounds = []

    def counted_round(tenant, max_leaves):
        rounds.append(tenant.pk)
        return one_round(tenant, max_leaves)

    def hold_after_the_first_round():
        # Asked between rounds: after the first, its transaction has committed and signed.
        if len(rounds) == 1:
            rounds.append(None)  # one hold only: later rounds run as they are
            os.write(fd, b"B")
            # The shutdown flag SIGTERM sets in shared memory; bounded: the test kills the worker
            # long before.
            wait_until(lambda: not keep_going(), "the shutdown flag", deadline=300)
        return keep_going()

    services.integrate_round = counted_round
    tasks.keep_going = hold_after_the_first_round
    app.worker_main(["worker", "--pool=prefork", "--concurrency=1", "-Q", queue, "-n", queue + "@%h",
                     "--loglevel=INFO", "--without-heartbeat", "--without-gossip", "--without-mingle"])
    """
)


def _read_signal(fd: int, worker: subprocess.Popen[Any], log: Path, timeout: float = 180) -> bytes:
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        pytest.fail(f"the worker never finished its first chunk:\n{log.read_text()[-3000:]}")
    signal_byte = os.read(fd, 1)
    if not signal_byte:  # the pipe closed: the worker died first
        worker.wait(timeout=30)
        pytest.fail(f"the worker exited ({worker.returncode}):\n{log.read_text()[-3000:]}")
    return signal_byte


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_worker_told_to_stop_mid_integration_exits_promptly_and_leaves_it_resumable(
    tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from django.db import connection

    _catch_up(tenant_a)
    # This test queues its own integration: the ingest's after-commit request is switched off.
    monkeypatch.setattr(transparency_tasks, "request_integration", lambda tenant_id: None)
    writer = Writer(tenant_a, "agent-long")
    while _tree(tenant_a)[0] < LEAVES:
        writer.saga(f"long-{writer.seq}", steps=499)  # 1,000 records a batch

    queue = f"test-shutdown-{uuid.uuid4().hex[:12]}"  # no other worker on this broker takes it
    db = connection.settings_dict
    env = {
        **{
            k: v for k, v in os.environ.items() if k != "DATABASE_OWNER_URL"
        },  # a worker: the runtime role only
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "SAGAPLANE_INTEGRATION_CHUNK_LEAVES": str(CHUNK),
        "CELERY_TASK_ALWAYS_EAGER": "false",
    }
    before = _tree(tenant_a)[1]  # the tenant's creation records, integrated by _catch_up
    integrate_tenant.apply_async((tenant_a.pk,), queue=queue)
    log = tmp_path / "worker.log"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    read_fd, write_fd = os.pipe()
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, str(script), queue, str(write_fd)],
            pass_fds=(write_fd,),
            cwd=ROOT,
            env={**env, "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    os.close(write_fd)
    try:
        assert _read_signal(read_fd, worker, log) == b"B"  # mid-integration: one chunk done
        held_at = _tree(tenant_a)

        worker.send_signal(signal.SIGTERM)  # to the main process only, as an orchestrator does
        try:
            code = worker.wait(timeout=SHUTDOWN_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"warm shutdown did not finish:\n{log.read_text()[-3000:]}")
    finally:
        os.close(read_fd)
        stop_group(worker)
        _purge(queue)

    assert code == 0, log.read_text()[-3000:]
    log_size = held_at[0]
    assert log_size >= LEAVES and held_at == (log_size, before + CHUNK, before + CHUNK)
    # It stopped at the end of that chunk, with what it did committed and signed, and no further.
    assert _tree(tenant_a) == (log_size, before + CHUNK, before + CHUNK)
    assert f"stopped at {before + CHUNK} leaves" in log.read_text()

    # Resumable: the rest was requested again, and the next run extends the signed tree
    # (consistency with the last checkpoint is proven before it signs) to every leaf.
    try:
        resumed = [m for m in _queued() if m["headers"]["task"] == "transparency.integrate_tenant"]
        assert len(resumed) == 1
        _run_like_a_worker(resumed[0])
    finally:
        _purge()
    log_size, tree_size, signed = _tree(tenant_a)
    assert signed == tree_size == log_size
