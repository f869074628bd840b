"""The embedded broker (controlplane/broker.py): a worker polling the queue folder while the server or
beat writes to it gets every message whole, exactly once, and an unreadable file does not kill it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

from controlplane.broker import Transport

QUEUE = "celery"
BODY = "x" * 1_000_000  # a long write: a consumer polling in a loop lands inside it often


def _connection(folder: Path) -> Connection:
    (folder / "processed").mkdir(exist_ok=True)
    return Connection(
        "filesystem://localhost/",
        transport=Transport,
        transport_options={
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "data_folder_processed": str(folder / "processed"),
        },
    )


def test_a_worker_polling_during_writes_gets_every_message_whole_and_once(tmp_path: Path) -> None:
    sent = 60
    written = threading.Event()
    received: list[dict[str, Any]] = []
    failures: list[BaseException] = []

    def consume() -> None:
        with _connection(tmp_path) as connection:
            channel = connection.default_channel
            while True:
                drained = written.is_set()  # read before polling: nothing is put after it is set
                try:
                    received.append(channel._get(QUEUE))
                except Empty:
                    if drained:
                        return
                except BaseException as exc:  # the stock transport: JSONDecodeError on a half-written file
                    failures.append(exc)
                    return

    consumer = threading.Thread(target=consume)
    consumer.start()
    with _connection(tmp_path) as connection:
        for n in range(sent):
            connection.default_channel._put(QUEUE, {"n": n, "body": BODY})
    written.set()
    consumer.join()
    assert failures == []
    assert sorted(message["n"] for message in received) == list(range(sent))
    assert all(message["body"] == BODY for message in received)


def test_an_unreadable_message_file_is_skipped_and_the_next_one_delivered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / f"0_left-by-a-crash.{QUEUE}.msg").write_bytes(b"")  # sorts first
    with _connection(tmp_path) as connection:
        channel = connection.default_channel
        channel._put(QUEUE, {"n": 1})
        with caplog.at_level(logging.ERROR, logger="controlplane.broker"), pytest.raises(Empty):
            channel._get(QUEUE)
        assert "skipped an unreadable message" in caplog.text
        assert channel._get(QUEUE) == {"n": 1}
        with pytest.raises(Empty):
            channel._get(QUEUE)


def test_the_embedded_defaults_use_this_transport(tmp_path: Path) -> None:
    """Settings read without REDIS_URL (as `make run` does), in a process of their own."""
    services = ("DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL")
    env = {k: v for k, v in os.environ.items() if k not in services}
    env.update({"SAGAPLANE_DATA_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "controlplane.settings"})
    script = (
        "import django; django.setup()\n"
        "from controlplane.celery import app\n"
        "with app.connection_for_write() as c: print(type(c.transport).__module__)\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().splitlines()[-1] == "controlplane.broker"
