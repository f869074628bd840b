"""`sagaplane witness init | serve | evidence`: a C2SP tlog-witness anyone can run (stdlib HTTP
server, the `crypto` extra for signatures).

    sagaplane witness init --name witness.example/w1 --dir ./w1      # prints the vkeys
    sagaplane witness serve --dir ./w1 --listen 127.0.0.1:7380 \\
        --log "sagaplane.example/acme acme-log+1234abcd+AX..."          # repeatable, or --log-file
    sagaplane witness evidence --dir ./w1                            # refused, validly signed ones

`serve` answers `POST /add-checkpoint` (tlog-witness) and `GET /<sha256(origin) hex>/checkpoint`
(the latest checkpoint it cosigned for that log, with its cosignatures), HTTP/1.1 keep-alive.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from . import note
from .witness import Answer, Witness, parse_log_lines, write_new_witness

MAX_BODY = 1 << 20  # a checkpoint with 16 ML-DSA-44 cosignatures is ~55 KB
_ORIGIN_HASH = re.compile(r"/([0-9a-f]{64})/checkpoint\Z")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the spec recommends
    # Headers and body are two writes: without TCP_NODELAY a kept-alive client waits out its
    # delayed ACK (~40 ms) on every answer.
    disable_nagle_algorithm = True
    server_version = "sagaplane-witness"
    witness: Witness  # set on the subclass made by `make_server`

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per refusal only
        pass

    def _send(self, answer: Answer) -> None:
        body = answer.body.encode("utf-8")
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] != "add-checkpoint":
            self._send(Answer(404, "not found\n"))
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            self._send(Answer(411, "a Content-Length is required\n"))
            return
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._send(Answer(413, f"the body is limited to {MAX_BODY} bytes\n"))
            return
        answer = self.witness.add_checkpoint(self.rfile.read(length))
        if answer.status >= 400 and answer.status != 409:
            print(f"refused {answer.status}: {answer.body.strip()}", file=sys.stderr, flush=True)
        self._send(answer)

    def do_GET(self) -> None:
        match = _ORIGIN_HASH.search(self.path.split("?", 1)[0])
        latest = self.witness.latest_by_origin_hash(match.group(1)) if match else None
        self._send(
            Answer(200, latest) if latest else Answer(404, "never cosigned a checkpoint of that log\n")
        )


def make_server(witness: Witness, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("WitnessHandler", (_Handler,), {"witness": witness})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError("--listen is HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def add_witness(sub: Any) -> None:
    p = sub.add_parser("witness", help="run a C2SP tlog-witness that cosigns logs' checkpoints")
    actions = p.add_subparsers(dest="witness_command", metavar="ACTION")
    actions.required = True
    init = actions.add_parser("init", help="make the witness's keys and print its vkeys")
    init.add_argument("--name", required=True, help="the witness's key name, e.g. witness.example/w1")
    init.add_argument("--dir", required=True, help="its folder (keys and state)")
    init.set_defaults(func=cmd_witness_init)
    serve = actions.add_parser("serve", help="serve POST /add-checkpoint")
    serve.add_argument("--dir", required=True)
    serve.add_argument("--listen", type=_listen, default=("127.0.0.1", 7380), metavar="HOST:PORT")
    serve.add_argument(
        "--log", action="append", default=[], metavar="'ORIGIN VKEY'", help="a log to witness (repeatable)"
    )
    serve.add_argument("--log-file", action="append", default=[], help="a file of 'ORIGIN VKEY' lines")
    serve.set_defaults(func=cmd_witness_serve)
    evidence = actions.add_parser("evidence", help="print the validly signed checkpoints it refused (JSON)")
    evidence.add_argument("--dir", required=True)
    evidence.set_defaults(func=cmd_witness_evidence)


def cmd_witness_init(args: argparse.Namespace) -> int:
    try:
        keys = write_new_witness(args.dir, args.name)
    except FileExistsError:
        print(f"error: {args.dir} already holds a witness key", file=sys.stderr)
        return EXIT_USAGE
    except note.NoteError as exc:
        print(f"error: --name: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for key in keys:  # Ed25519 (0x04) first, then ML-DSA-44 (0x06)
        print(key.verifier.encode())
    return EXIT_OK


def _logs(args: argparse.Namespace) -> dict[str, list[note.Verifier]]:
    lines = list(args.log)
    for path in args.log_file:
        lines.extend(Path(path).read_text().splitlines())
    return parse_log_lines(lines)


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def cmd_witness_serve(args: argparse.Namespace) -> int:
    try:
        logs = _logs(args)
        if not logs:
            raise ValueError("no log to witness: give --log 'ORIGIN VKEY' or --log-file")
        witness = Witness(args.dir, logs)
    except FileNotFoundError as exc:
        print(f"error: {exc.filename}: no such file (run `sagaplane witness init` first?)", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    host, port = args.listen
    server = make_server(witness, host, port)
    signal.signal(signal.SIGTERM, _interrupt)  # stop between requests; the state is committed
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    print(f"witness {witness.name} listening on {bound_host}:{bound_port} for {len(logs)} log(s)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return EXIT_OK


def cmd_witness_evidence(args: argparse.Namespace) -> int:
    if not (Path(args.dir) / "witness.db").exists():
        print(f"error: {args.dir} holds no witness state", file=sys.stderr)
        return EXIT_USAGE
    witness = Witness(args.dir, {})
    items = witness.evidence()
    print(witness.evidence_json())
    return EXIT_FAILED if items else EXIT_OK
