"""The shipper against a local test double that speaks the ingest contract."""

from __future__ import annotations

import json
import logging
import socket
import threading
from typing import Any

import pytest
import sagaplane as sp
from sagaplane.cli import main as cli_main
from sagaplane.shipper import Backoff, ShipperState
from sagaplane_testkit import API_KEY, FakeControlPlane, read_wal

NO_WAIT = Backoff(base=0.0, cap=0.0)


@pytest.fixture
def server() -> Any:
    s = FakeControlPlane()
    yield s
    s.close()


def fill(wal: sp.WAL, n: int) -> None:
    for i in range(n):
        wal.append("SAGA_START", {"saga_id": f"s{i}", "pid": 1, "lease_ttl": 30.0})


def test_ships_everything_once_in_order_with_bounded_batches(tmp_path: Any, server: FakeControlPlane) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 23)
    shipper = sp.Shipper(wal.path, url=server.url, api_key=API_KEY, batch_size=5)
    assert shipper.flush(10)
    assert server.records(wal.stream_id) == read_wal(wal.path)
    assert max(r["count"] for r in server.requests) <= 5
    # Records appended later are picked up by the running thread.
    wal.subscribe(shipper.notify)
    fill(wal, 4)
    assert shipper.flush(10)
    assert server.records(wal.stream_id) == read_wal(wal.path)
    cursor = json.loads(shipper.cursor_file.read_text())
    assert cursor["offset"] == (tmp_path / "a.wal").stat().st_size
    assert cursor["hash"] == read_wal(wal.path)[-1]["_h"] and cursor["stream"] == wal.stream_id
    # Keyed by destination, never holding the key itself.
    assert (
        cursor["url"] == server.url
        and cursor["key"].startswith("sha256:")
        and API_KEY not in json.dumps(cursor)
    )
    shipper.close()
    wal.close()


def test_cursor_resumes_after_restart_without_resending(tmp_path: Any, server: FakeControlPlane) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 10)
    first = sp.Shipper(wal.path, url=server.url, api_key=API_KEY)
    assert first.run_until_caught_up() == 10
    fill(wal, 3)
    second = sp.Shipper(wal.path, url=server.url, api_key=API_KEY)
    assert second.cursor.offset == first.cursor.offset
    assert second.run_until_caught_up() == 3
    assert sum(r["count"] for r in server.requests) == 13  # nothing was sent twice
    assert server.records(wal.stream_id) == read_wal(wal.path)
    wal.close()


def test_lost_cursor_resumes_at_the_server_head(tmp_path: Any, server: FakeControlPlane) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 6)
    first = sp.Shipper(wal.path, url=server.url, api_key=API_KEY)
    assert first.run_until_caught_up() == 6
    first.cursor_file.unlink()
    fill(wal, 2)
    again = sp.Shipper(wal.path, url=server.url, api_key=API_KEY)
    assert again.cursor.offset == 0  # nothing remembered locally; the server knows
    assert again.run_until_caught_up() == 2
    assert again.duplicates == 0 and again.accepted == 2
    assert [r["count"] for r in server.requests] == [6, 2]
    assert server.records(wal.stream_id) == read_wal(wal.path)
    wal.close()


def test_a_stale_cursor_is_corrected_by_the_server_head(tmp_path: Any, server: FakeControlPlane) -> None:
    """The server lost its latest records (restored from a backup): they are sent again."""
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 8)
    assert sp.Shipper(wal.path, url=server.url, api_key=API_KEY, batch_size=3).run_until_caught_up() == 8
    with server.lock:
        del server.streams[wal.stream_id][5:]
    again = sp.Shipper(wal.path, url=server.url, api_key=API_KEY)
    assert again.cursor.offset == (tmp_path / "a.wal").stat().st_size  # the cursor says: all shipped
    assert again.run_until_caught_up() == 3 and again.accepted == 3
    assert server.records(wal.stream_id) == read_wal(wal.path)
    wal.close()


def test_a_server_head_missing_from_the_wal_stops_shipping_naming_it(
    tmp_path: Any, server: FakeControlPlane
) -> None:
    other = sp.WAL(tmp_path / "other.wal", fsync=False)
    fill(other, 3)
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 3)
    foreign = read_wal(other.path)
    with server.lock:
        server.streams[wal.stream_id] = foreign  # the server's stream came from another WAL
    shipper = sp.Shipper(wal.path, url=server.url, api_key=API_KEY)
    with pytest.raises(sp.ShipFailed) as failed:
        shipper.run_until_caught_up()
    assert foreign[-1]["_h"] in failed.value.reason and "not in" in failed.value.reason
    assert shipper.state is ShipperState.FAILED and server.requests == []  # nothing sent on a guess
    wal.close()
    other.close()


def test_a_key_that_cannot_read_the_head_resumes_where_a_refusal_says(
    tmp_path: Any, server: FakeControlPlane
) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 6)
    records = read_wal(wal.path)
    assert sp.Shipper(wal.path, url=server.url, api_key=API_KEY).run_until_caught_up() == 6
    server.readable = False
    fill(wal, 1)
    # The server says the batch does not link to its head, which is record 2.
    server.script(
        (422, {"error": "chain_broken", "reason": "broken_link", "index": 0, "expected": records[1]["_h"]})
    )
    again = sp.Shipper(wal.path, url=server.url, api_key=API_KEY)
    assert again.run_until_caught_up() == 5
    assert [(r["count"], r["status"]) for r in server.requests[1:]] == [(1, 422), (5, 200)]
    assert again.duplicates == 4 and again.accepted == 1
    assert server.records(wal.stream_id) == read_wal(wal.path)
    wal.close()


def test_control_plane_down_then_back_every_record_once_in_order(
    tmp_path: Any, server: FakeControlPlane
) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    server.script((503, {"error": "unavailable"}), (500, {"error": "boom"}), (429, {"error": "slow down"}))
    delays_seen: list[float] = []
    backoff = Backoff(base=0.001, cap=0.004, rng=lambda: 1.0)
    shipper = sp.Shipper(wal.path, url=server.url, api_key=API_KEY, batch_size=4, backoff=backoff)
    wal.subscribe(shipper.notify)
    shipper.start()
    # The agent keeps working while the server is failing.
    for i in range(3):
        with sp.saga(name=f"s{i}", wal=wal):
            pass
    assert shipper.flush(10)
    delays_seen = shipper.delays
    assert shipper.retries == 3 and delays_seen == [0.001, 0.002, 0.004]  # exponential, capped
    assert [r["status"] for r in server.requests[:3]] == [503, 500, 429]
    assert server.records(wal.stream_id) == read_wal(wal.path)
    shipper.close()
    wal.close()


def test_connection_refused_is_retried(tmp_path: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 2)
    dead = FakeControlPlane()
    url = dead.url
    dead.close()  # nothing listens there any more
    shipper = sp.Shipper(wal.path, url=url, api_key=API_KEY, backoff=NO_WAIT)
    with pytest.raises(sp.ShipFailed, match="giving up after 3 retries"):
        shipper.run_until_caught_up(max_retries=3)
    assert shipper.retries == 3 and shipper.cursor.offset == 0
    wal.close()


def test_backoff_has_full_jitter_and_honours_retry_after() -> None:
    b = Backoff(base=1.0, cap=8.0, rng=lambda: 0.5)
    assert [b.delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert b.delay(0, retry_after=3.0) == 3.0
    assert b.delay(0, retry_after=100.0) == 8.0
    zero = Backoff(base=1.0, cap=8.0, rng=lambda: 0.0)
    assert zero.delay(10) == 0.0


def test_chain_rejection_stops_loudly_and_keeps_everything(
    tmp_path: Any, server: FakeControlPlane, caplog: Any
) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 5)
    wal.close()
    before = (tmp_path / "a.wal").read_bytes()
    server.script((422, {"error": "chain_broken", "seq": 3, "index": 2, "reason": "payload does not match"}))
    shipper = sp.Shipper(tmp_path / "a.wal", url=server.url, api_key=API_KEY)
    with caplog.at_level(logging.ERROR, logger="sagaplane.shipper"):
        shipper.start()
        assert shipper.flush(10) is False
    assert shipper.state is ShipperState.FAILED
    assert (
        shipper.failure is not None
        and "seq=3" in shipper.failure.reason
        and "index=2" in shipper.failure.reason
    )
    assert "payload does not match" in shipper.failure.reason
    assert any(r.levelno == logging.ERROR and "STOPPED" in r.getMessage() for r in caplog.records)
    assert shipper.cursor.offset == 0 and (tmp_path / "a.wal").read_bytes() == before
    assert len(server.requests) == 1  # no retry storm against a refusal
    shipper.close()


def test_real_chain_break_detected_by_server(tmp_path: Any, server: FakeControlPlane) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 4)
    wal.close()
    lines = (tmp_path / "a.wal").read_text().splitlines()
    rec = json.loads(lines[2])
    rec["saga_id"] = "tampered"
    lines[2] = json.dumps(rec)
    (tmp_path / "a.wal").write_text("\n".join(lines) + "\n")
    shipper = sp.Shipper(tmp_path / "a.wal", url=server.url, api_key=API_KEY)
    with pytest.raises(sp.ShipFailed) as info:
        shipper.run_until_caught_up()
    assert info.value.status == 422 and "seq=3" in info.value.reason
    assert server.records(shipper.stream_id) == []  # rejected whole


@pytest.mark.parametrize("status", [401, 403])
def test_refused_key_fails_with_auth_error(tmp_path: Any, server: FakeControlPlane, status: int) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 1)
    if status == 403:
        server.script((403, {"error": "scope_missing"}))
        key = API_KEY
    else:
        key = "wrong"
    shipper = sp.Shipper(wal.path, url=server.url, api_key=key)
    with pytest.raises(sp.ShipFailed) as info:
        shipper.run_until_caught_up()
    assert info.value.status == status and "API key refused" in info.value.reason
    assert shipper.state is ShipperState.FAILED
    wal.close()


def test_413_halves_the_batch(tmp_path: Any, server: FakeControlPlane) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 9)
    server.max_records = 2
    shipper = sp.Shipper(wal.path, url=server.url, api_key=API_KEY, batch_size=8)
    assert shipper.run_until_caught_up() == 9
    assert shipper.batch_size == 2
    assert server.records(wal.stream_id) == read_wal(wal.path)
    wal.close()


def test_missing_configuration_is_a_clear_error(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("SAGAPLANE_URL", raising=False)
    monkeypatch.delenv("SAGAPLANE_API_KEY", raising=False)
    with pytest.raises(sp.ConfigurationError, match="SAGAPLANE_URL"):
        sp.Client()
    with pytest.raises(sp.ConfigurationError, match="SAGAPLANE_API_KEY"):
        sp.Client(url="http://127.0.0.1:1")
    monkeypatch.setenv("SAGAPLANE_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("SAGAPLANE_API_KEY", "k")
    client = sp.Client()
    assert client.url == "http://127.0.0.1:1" and client.api_key == "k"
    monkeypatch.delenv("SAGAPLANE_API_KEY")
    with pytest.raises(sp.ConfigurationError, match="API key"):
        sp.configure(tmp_path / "x.wal")  # a URL but no key: refuse rather than run unshipped
    assert not (tmp_path / "x.wal").exists()


def test_configure_ships_in_the_background(tmp_path: Any, server: FakeControlPlane) -> None:
    # The double speaks only the ingest contract: no fleet status, so no gate here (tests/fleet has it).
    runtime = sp.configure(tmp_path / "agent.wal", url=server.url, api_key=API_KEY, gate=False)
    try:
        t = sp.tool(lambda x: x, name="t", semantics=sp.COMPENSABLE, compensate=None)
        with sp.saga(name="configured"):
            t(1)
        assert runtime.flush(10)
        assert server.records(runtime.wal.stream_id) == read_wal(tmp_path / "agent.wal")
    finally:
        sp.shutdown()


def test_flush_returns_false_on_timeout_while_backing_off(tmp_path: Any, server: FakeControlPlane) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 1)
    server.script(*[(503, {"error": "down"})] * 50)
    entered_backoff = threading.Event()
    shipper = sp.Shipper(
        wal.path,
        url=server.url,
        api_key=API_KEY,
        backoff=Backoff(base=30.0, cap=30.0, rng=lambda: (entered_backoff.set(), 1.0)[1]),
    )
    shipper.start()
    assert entered_backoff.wait(10)
    assert shipper.flush(0.05) is False and shipper.state is ShipperState.BACKOFF
    shipper.close(10)  # close cuts a 30 s backoff short
    assert shipper.state is ShipperState.CLOSED
    wal.close()


# -- CLI ------------------------------------------------------------------------------------------


def test_cli_ship_and_resume(tmp_path: Any, server: FakeControlPlane, capsys: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 7)
    args = ["ship", str(wal.path), "--url", server.url, "--api-key", API_KEY, "--stream", wal.stream_id]
    assert cli_main(args) == 0
    assert "shipped 7 record(s)" in capsys.readouterr().out
    fill(wal, 2)
    assert cli_main(args) == 0
    assert "shipped 2 record(s)" in capsys.readouterr().out
    assert server.records(wal.stream_id) == read_wal(wal.path)
    wal.close()


def test_cli_ship_failure_exit_codes(
    tmp_path: Any, server: FakeControlPlane, capsys: Any, monkeypatch: Any
) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 1)
    wal.close()
    assert cli_main(["ship", str(wal.path), "--url", server.url, "--api-key", "nope"]) == 2
    assert "API key refused" in capsys.readouterr().err
    server.script((409, {"error": "equivocation", "seq": 1}))
    assert cli_main(["ship", str(wal.path), "--url", server.url, "--api-key", API_KEY]) == 1
    assert "equivocation" in capsys.readouterr().err
    monkeypatch.delenv("SAGAPLANE_URL", raising=False)
    assert cli_main(["ship", str(wal.path), "--api-key", API_KEY]) == 2
    assert "SAGAPLANE_URL" in capsys.readouterr().err


def test_cli_ships_an_agent_saga_wal(tmp_path: Any, server: FakeControlPlane, capsys: Any) -> None:
    import asyncio

    from agent_saga import saga_scope
    from agent_saga.wal import FileWAL

    path = tmp_path / "as.wal"

    async def run() -> None:
        w = FileWAL(path)
        await w.start()
        async with saga_scope(name="from-agent-saga", wal=w):
            pass
        await w.close()

    asyncio.run(run())
    asyncio.run(run())  # restarted writer: seq restarts, chain continues
    assert cli_main(["ship", str(path), "--url", server.url, "--api-key", API_KEY]) == 0
    stream = json.loads((tmp_path / "as.wal.meta.json").read_text())["stream_id"]
    assert server.records(stream) == read_wal(path)
    assert [r["seq"] for r in server.records(stream)] == [1, 2, 1, 2]


def test_cli_verify_wal(tmp_path: Any, capsys: Any) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 5)
    wal.close()
    assert cli_main(["verify-wal", str(wal.path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK:") and "5 record(s)" in out
    with open(wal.path, "ab") as fh:
        fh.write(b'{"torn')
    assert cli_main(["verify-wal", str(wal.path)]) == 0
    assert "torn final line" in capsys.readouterr().out
    lines = (tmp_path / "a.wal").read_bytes().splitlines(keepends=True)[:5]
    rec = json.loads(lines[3])
    rec["pid"] = 666
    lines[3] = (json.dumps(rec) + "\n").encode()
    (tmp_path / "a.wal").write_bytes(b"".join(lines))
    assert cli_main(["verify-wal", str(wal.path)]) == 1
    out = capsys.readouterr().out
    assert "seq=4 index=3" in out and "content digest" in out
    lines[3] = b"garbage\n"
    (tmp_path / "a.wal").write_bytes(b"".join(lines))
    assert cli_main(["verify-wal", str(wal.path)]) == 1
    assert "line 4 is not a JSON record" in capsys.readouterr().out


def test_python_dash_m_entry_point() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "sagaplane", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "verify-wal" in out.stdout and "ship" in out.stdout


# -- raw batches, limits from a 413, kept-alive connections ----------------------------------------


def capture_bodies(server: FakeControlPlane) -> list[bytes]:
    """Every request body the fake receives, byte for byte."""
    bodies: list[bytes] = []
    handle = server.handle

    def spy(path: str, auth: str, raw: bytes) -> Any:
        bodies.append(raw)
        return handle(path, auth, raw)

    server.handle = spy  # type: ignore[method-assign]
    return bodies


def test_lines_are_sent_as_they_are_on_disk_and_stored_as_the_same_records(
    tmp_path: Any, server: FakeControlPlane
) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    for i in range(7):
        wal.append("SAGA_START", {"saga_id": f"s{i}-é✓", "pid": 1, "lease_ttl": 30.0, "n": [1.5, None, True]})
    wal.close()
    # Another writer's formatting (ASCII escapes, spaced separators, blank lines, CRLF): the same
    # JSON objects, so the same chain; the shipper must not need to re-encode them.
    records = read_wal(wal.path)
    lines = [json.dumps(r, ensure_ascii=True, separators=(", ", " : ")).encode() for r in records]
    (tmp_path / "a.wal").write_bytes(b"\n".join(lines[:3]) + b"\r\n\n" + b"\n".join(lines[3:]) + b"\n")
    bodies = capture_bodies(server)
    shipper = sp.Shipper(wal.path, url=server.url, api_key=API_KEY, batch_size=4, backoff=NO_WAIT)
    assert shipper.run_until_caught_up() == 7
    assert bodies == [
        b'{"records":[' + b",".join(lines[:4]) + b"]}",
        b'{"records":[' + b",".join(lines[4:]) + b"]}",
    ]
    assert server.records(wal.stream_id) == records  # the server holds the very same records
    assert shipper.cursor.offset == (tmp_path / "a.wal").stat().st_size
    assert shipper.cursor.hash == records[-1]["_h"] and shipper.cursor.seq == records[-1]["seq"]


def test_an_unparseable_line_ends_the_batch_before_it_and_is_never_skipped(
    tmp_path: Any, server: FakeControlPlane
) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 3)
    wal.close()
    good = (tmp_path / "a.wal").read_bytes()
    with open(tmp_path / "a.wal", "ab") as fh:
        fh.write(b'{"seq": 4, "event": "STEP_INT\n["not", "an object"]\n')
    shipper = sp.Shipper(wal.path, url=server.url, api_key=API_KEY, backoff=NO_WAIT)
    with pytest.raises(sp.ShipFailed, match=f"unparseable line at byte {len(good)}.*refusing to skip it"):
        shipper.run_until_caught_up()
    assert shipper.cursor.offset == len(good) and shipper.cursor.shipped == 3
    assert len(server.requests) == 1 and server.records(wal.stream_id) == read_wal_prefix(tmp_path, 3)


def read_wal_prefix(folder: Any, n: int) -> list[dict[str, Any]]:
    with open(folder / "a.wal", "rb") as fh:
        return [json.loads(fh.readline()) for _ in range(n)]


@pytest.mark.parametrize(
    ("error", "limit", "attr"),
    [("too_many_records", 3, "batch_size"), ("too_large", 1200, "max_batch_bytes")],
)
def test_413_naming_a_limit_adopts_it(
    tmp_path: Any, server: FakeControlPlane, error: str, limit: int, attr: str
) -> None:
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 10)
    server.script((413, {"error": error, "detail": "too big", "limit": limit}))
    bodies = capture_bodies(server)
    shipper = sp.Shipper(wal.path, url=server.url, api_key=API_KEY, backoff=NO_WAIT)
    assert shipper.run_until_caught_up() == 10
    assert getattr(shipper, attr) == limit and shipper.retries == 0  # adapted at once, no backoff
    assert len(json.loads(bodies[0])["records"]) == 10  # the SDK's default: everything in one go
    for body in bodies[1:]:
        assert (len(json.loads(body)["records"]) if attr == "batch_size" else len(body)) <= limit
    assert len(bodies) > 2
    assert server.records(wal.stream_id) == read_wal(wal.path)


def test_batches_share_one_kept_alive_connection(tmp_path: Any, server: FakeControlPlane) -> None:
    server.server.RequestHandlerClass.protocol_version = "HTTP/1.1"  # the fake keeps connections open
    wal = sp.WAL(tmp_path / "a.wal", fsync=False)
    fill(wal, 12)
    shipper = sp.Shipper(wal.path, url=server.url, api_key=API_KEY, batch_size=3)
    assert shipper.run_until_caught_up() == 12
    assert len(server.requests) == 4 and shipper.client.connections_opened == 1
    assert server.records(wal.stream_id) == read_wal(wal.path)
    shipper.client.close()
    wal.close()


class OneShotServer:
    """Raw HTTP/1.1 on a socket: answers each connection's first request (keeping it open), then
    reads the next request on it and hangs up without answering, like a server that closed an
    idle keep-alive connection just as the client reused it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.answered = 0
        self.dropped = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _read_request(self, conn: socket.socket, buf: bytes) -> tuple[bytes, bytes] | None:
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            rest += conn.recv(65536)
        return head, rest[length:]

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                first = self._read_request(conn, b"")
                if first is None:
                    continue
                body = b'{"ok": true}'
                self.answered += 1  # counted before the client can see the answer
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                if self._read_request(conn, first[1]) is not None:
                    self.dropped += 1  # then hang up (leaving `with`) without an answer

    def close(self) -> None:
        self.sock.close()


def test_a_request_dropped_on_a_reused_connection_is_resent_once_only_when_harmless() -> None:
    server = OneShotServer()
    client = sp.Client(server.url, API_KEY)
    try:
        assert client.get("/a").status == 200 and client.connections_opened == 1
        # GET (idempotent): the dropped request goes again on a new connection.
        assert client.get("/b").status == 200
        assert (server.dropped, server.answered, client.connections_opened) == (1, 2, 2)
        # A record batch may be resent too: the server stores a record once.
        assert client.start_records_raw("st_x", b'{"records":[]}').response().status == 200
        assert (server.dropped, server.answered, client.connections_opened) == (2, 3, 3)
        # Any other POST is not sent twice behind the caller's back: it is a transport error.
        with pytest.raises(sp.TransportError):
            client.post("/other", {"x": 1})
        assert (server.dropped, server.answered) == (3, 3)
        assert client.post("/other", {"x": 1}).status == 200  # the next call reconnects
    finally:
        client.close()
        server.close()
