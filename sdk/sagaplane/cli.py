"""`sagaplane` command line.

One `add_<name>(subparsers)` function registers each subcommand and points it at
a `cmd_<name>(args) -> int` function. To add a subcommand (verify-disclosure,
verify-export, worker), write that pair and add the `add_` function to
SUBCOMMANDS; nothing else changes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from ._version import __version__
from .integrations.mcp_cli import add_mcp_gateway, add_upstream_options
from .reconcile import add_certify, add_reconcile, add_reconcile_worker
from .shipper import DEFAULT_BATCH
from .witnesscli import add_witness

EXIT_OK = 0
EXIT_FAILED = 1  # the thing checked is bad, or shipping was refused
EXIT_USAGE = 2  # bad arguments or configuration (argparse also uses 2)
EXIT_QUORUM = 3  # the evidence holds, but the policy's quorum of witnesses did not cosign it


# -- verify-wal ------------------------------------------------------------------------------


def add_verify_wal(sub: Any) -> None:
    p = sub.add_parser("verify-wal", help="check a WAL file's hash chain locally")
    p.add_argument("wal_file")
    p.add_argument("--strict", action="store_true", help="also refuse records that carry no hash")
    p.set_defaults(func=cmd_verify_wal)


def cmd_verify_wal(args: argparse.Namespace) -> int:
    from .chain import verify_chain
    from .walfile import read_all

    try:
        entries, torn = read_all(args.wal_file)
    except OSError as exc:
        print(f"error: cannot read {args.wal_file}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    records = [e.record for e in entries if e.record is not None]
    report = verify_chain(records, strict=args.strict)
    bad_line = next((i for i, e in enumerate(entries) if e.bad is not None), None)
    # Name whichever problem comes first in the file.
    first = report.first_break
    line_of_break = None
    if first is not None:
        parsed = [i for i, e in enumerate(entries) if e.record is not None]
        line_of_break = parsed[first.index]
    if bad_line is not None and (line_of_break is None or bad_line < line_of_break):
        bad = entries[bad_line].bad
        print(
            f"BROKEN: {args.wal_file}: line {bad_line + 1} is not a JSON record ({bad}); "
            f"the record after it cannot be checked against it"
        )
        return EXIT_FAILED
    if first is not None:
        print(
            f"BROKEN: {args.wal_file}: first bad record seq={first.seq} index={first.index} "
            f"(line {line_of_break + 1 if line_of_break is not None else '?'}): {first.reason}"
        )
        if len(report.breaks) > 1:
            print(f"  ({len(report.breaks) - 1} further break(s))")
        return EXIT_FAILED
    extra = f"; ignored a torn final line of {torn} byte(s) (a crash mid-write)" if torn else ""
    print(f"OK: {args.wal_file}: {report.summary()}; head seq {report.head_seq}{extra}")
    return EXIT_OK


# -- ship ------------------------------------------------------------------------------------


def add_ship(sub: Any) -> None:
    p = sub.add_parser("ship", help="ship a WAL file (resumable; agent-saga WALs too) to the control plane")
    p.add_argument("wal_file")
    p.add_argument("--stream", help="stream id (default: the one in WAL_FILE.meta.json, created if missing)")
    p.add_argument("--url", help="control plane URL (default: $SAGAPLANE_URL)")
    p.add_argument("--api-key", help="API key (default: $SAGAPLANE_API_KEY)")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH, help="records per batch")
    p.add_argument("--max-retries", type=int, default=8, help="transient failures in a row before giving up")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_ship)


class _Progress:
    """A one-line bar on a terminal; silent otherwise so logs and pipes stay clean."""

    def __init__(self, total: int, stream: Any) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream

    def __call__(self, n: int, _response: Any) -> None:
        self.done += n
        width = 30
        filled = min(width, int(width * self.done / self.total))
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} records")
        self.stream.flush()

    def end(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def cmd_ship(args: argparse.Namespace) -> int:
    from .client import Client, ConfigurationError
    from .shipper import Backoff, ShipFailed, Shipper
    from .walfile import iter_entries

    if not os.path.exists(args.wal_file):
        print(f"error: {args.wal_file} does not exist", file=sys.stderr)
        return EXIT_USAGE
    try:
        client = Client(args.url, args.api_key)
        shipper = Shipper(
            args.wal_file,
            stream_id=args.stream,
            client=client,
            batch_size=args.batch_size,
            backoff=Backoff(base=0.5, cap=30.0),
        )
    except (ConfigurationError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if shipper.failure is not None:
        print(f"error: {shipper.failure}", file=sys.stderr)
        return EXIT_FAILED
    progress = None
    if sys.stdout.isatty() and not args.no_progress:
        remaining = sum(1 for _ in iter_entries(args.wal_file, shipper.cursor.offset))
        progress = _Progress(remaining, sys.stdout)
        shipper.on_batch = progress
    try:
        shipped = shipper.run_until_caught_up(max_retries=args.max_retries)
    except ShipFailed as exc:
        if progress:
            progress.end()
        print(f"FAILED: {exc.reason}", file=sys.stderr)
        if exc.status in (401, 403):
            return EXIT_USAGE
        return EXIT_FAILED
    if progress:
        progress.end()
    head = (
        shipper.last_response.body.get("head")
        if shipper.last_response and isinstance(shipper.last_response.body, dict)
        else None
    )
    print(
        f"shipped {shipped} record(s) to stream {shipper.stream_id} "
        f"({shipper.accepted} accepted, {shipper.duplicates} duplicate(s)); "
        f"cursor at byte {shipper.cursor.offset}, seq {shipper.cursor.seq}"
        + (f"; server head seq {head.get('seq')}" if isinstance(head, dict) else "")
    )
    return EXIT_OK


# -- verify-disclosure / verify-export / verify-checkpoint / verify-proof ------------------


def _add_key_option(p: Any, *, policy: bool = True) -> None:
    p.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="VERIFIER_KEY",
        help="the tenant's log verifier key (name+id+key); repeat to accept old and new during a rotation"
        + (" (default: the policy's log keys)" if policy else ""),
    )
    if policy:
        p.add_argument(
            "--policy",
            metavar="FILE",
            help="a C2SP tlog-policy file: the log's keys, the witnesses and the quorum that must "
            f"have cosigned the checkpoint (exit {EXIT_QUORUM} when it did not)",
        )


def _report_verification(
    target: str, verify: Callable[[], Any], failures: tuple[type[Exception], ...]
) -> int:
    """One shape for every offline verifier: OK and a summary (exit 0), or the first failure (exit 1)."""
    try:
        report = verify()
    except failures as exc:
        print(f"FAILED: {target}: {exc}")
        return EXIT_FAILED
    print(f"OK: {target}: {report.summary()}")
    return EXIT_OK


def _verified(
    args: argparse.Namespace, target: str, verify: Callable[[list[str]], Any], checkpoint: Callable[[], str]
) -> int:
    """Run `verify(keys)` (keys: --key, else the policy's logs), then, with --policy, require the
    quorum of witnesses on the evidence's checkpoint (`checkpoint()`, its signed note)."""
    from .disclosure import VerificationError
    from .policy import PolicyError, QuorumError, load_policy
    from .tlogproof import ProofFileError

    policy = None
    keys: list[str] = list(args.key)
    if args.policy:
        try:
            policy = load_policy(args.policy)
        except PolicyError as exc:
            print(f"error: --policy: {exc}", file=sys.stderr)
            return EXIT_USAGE
        keys = keys or [log.encode() for log in policy.logs]
    if not keys:
        print("error: give the log's --key, or a --policy naming the log", file=sys.stderr)
        return EXIT_USAGE
    failures = (VerificationError, ProofFileError, ValueError, OSError)
    code = _report_verification(target, lambda: verify(keys), failures)
    if code != EXIT_OK or policy is None:
        return code
    try:
        witnessed = policy.check(checkpoint())
    except QuorumError as exc:
        print(f"REFUSED: {target}: {exc}")
        return EXIT_QUORUM
    except ValueError as exc:  # the policy's logs do not include the key that signed it
        print(f"FAILED: {target}: the checkpoint does not verify against the policy: {exc}")
        return EXIT_FAILED
    print(f"WITNESSED: {target}: {witnessed.summary()}")
    return EXIT_OK


def add_verify_disclosure(sub: Any) -> None:
    p = sub.add_parser("verify-disclosure", help="verify a saga disclosure offline (signature, proofs, seal)")
    p.add_argument("file")
    _add_key_option(p)
    p.set_defaults(func=cmd_verify_disclosure)


def cmd_verify_disclosure(args: argparse.Namespace) -> int:
    import json

    from .disclosure import verify_disclosure_file

    def checkpoint() -> str:
        with open(args.file, encoding="utf-8") as fh:
            return str(json.load(fh).get("checkpoint"))

    return _verified(args, args.file, lambda keys: verify_disclosure_file(args.file, keys), checkpoint)


def add_verify_export(sub: Any) -> None:
    p = sub.add_parser("verify-export", help="verify a WORM export (tar.gz or folder) offline")
    p.add_argument("path")
    _add_key_option(p)
    p.set_defaults(func=cmd_verify_export)


def cmd_verify_export(args: argparse.Namespace) -> int:
    from .export import read_bundle, verify_export

    return _verified(
        args,
        args.path,
        lambda keys: verify_export(args.path, keys),
        lambda: read_bundle(args.path)["checkpoint"].decode("utf-8", "replace"),
    )


def add_verify_checkpoint(sub: Any) -> None:
    p = sub.add_parser(
        "verify-checkpoint", help="verify a checkpoint (GET /api/v1/audit/checkpoint) and its cosignatures"
    )
    p.add_argument("file", help="the checkpoint note, with any cosignature lines; - reads standard input")
    _add_key_option(p)
    p.set_defaults(func=cmd_verify_checkpoint)


def cmd_verify_checkpoint(args: argparse.Namespace) -> int:
    from . import note

    text = sys.stdin.read() if args.file == "-" else None

    def read() -> str:
        if text is not None:
            return text
        with open(args.file, encoding="utf-8") as fh:
            return fh.read()

    class _Report:
        def __init__(self, checkpoint: note.Checkpoint) -> None:
            self.checkpoint = checkpoint

        def summary(self) -> str:
            return f"{self.checkpoint.origin} at size {self.checkpoint.size}, signed by the log"

    return _verified(args, args.file, lambda keys: _Report(note.open_checkpoint(read(), keys)), read)


def add_verify_proof(sub: Any) -> None:
    p = sub.add_parser("verify-proof", help="verify a C2SP tlog-proof file (one leaf's inclusion) offline")
    p.add_argument("file")
    _add_key_option(p)
    p.add_argument(
        "--leaf-hash",
        metavar="HEX",
        help="the leaf's RFC 6962 hash, in hex (default: computed from the record in the file's extra "
        "data, which the inclusion proof then authenticates)",
    )
    p.set_defaults(func=cmd_verify_proof)


def cmd_verify_proof(args: argparse.Namespace) -> int:
    from .tlogproof import parse_proof_file, verify_proof_file

    if args.leaf_hash is not None:
        try:
            leaf_hash = bytes.fromhex(args.leaf_hash)
        except ValueError:
            print(f"error: --leaf-hash is not hex: {args.leaf_hash!r}", file=sys.stderr)
            return EXIT_USAGE
    return _verified(
        args,
        args.file,
        lambda keys: verify_proof_file(
            args.file, keys, leaf_hash=leaf_hash if args.leaf_hash is not None else None
        ),
        lambda: parse_proof_file(args.file).checkpoint,
    )


# -- verify-approval ---------------------------------------------------------------------------


def add_verify_approval(sub: Any) -> None:
    p = sub.add_parser(
        "verify-approval", help="re-verify a saga disclosure's passkey approval votes offline (WebAuthn)"
    )
    p.add_argument("file", help="the saga's disclosure (GET /api/v1/audit/sagas/<id>/disclosure)")
    p.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="VERIFIER_KEY",
        help="the tenant's log verifier key: also verify the disclosure itself (repeatable)",
    )
    p.set_defaults(func=cmd_verify_approval)


def cmd_verify_approval(args: argparse.Namespace) -> int:
    from .approval import verify_approval_file
    from .disclosure import VerificationError

    return _report_verification(
        args.file, lambda: verify_approval_file(args.file, args.key), (VerificationError, ValueError)
    )


# -- worker ----------------------------------------------------------------------------------------


def add_worker(sub: Any) -> None:
    p = sub.add_parser("worker", help="run recovery jobs: compensations of sagas whose agent died")
    p.add_argument(
        "--handlers",
        default=None,
        help="comma-separated modules to import; their @sagaplane.compensator functions are run",
    )
    p.add_argument(
        "--policy",
        default=None,
        help="a tool policy file: run its compensations through the upstream MCP server given as "
        "-- UPSTREAM_COMMAND [ARGS...] or --upstream-url (what a killed mcp-gateway left)",
    )
    p.add_argument("--name", default=None, help="this worker's name in the evidence (default host:pid)")
    p.add_argument("--lease", type=float, default=30.0, help="seconds a claimed job is held (default 30)")
    p.add_argument("--wait", type=float, default=20.0, help="seconds one claim waits for a job (default 20)")
    p.add_argument("--max-jobs", type=int, default=None, help="exit after running this many jobs")
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="handlers run at once in a thread pool (default 1); jobs are claimed and their results "
        "reported in batches",
    )
    add_upstream_options(p)
    p.set_defaults(func=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    import signal
    import threading

    from .client import ConfigurationError
    from .semantics import import_handler_modules
    from .worker import Worker

    if not args.handlers and not args.policy:
        print("error: give --handlers MODULES and/or --policy FILE -- UPSTREAM", file=sys.stderr)
        return EXIT_USAGE
    upstream = None
    try:
        if args.handlers:
            import_handler_modules(args.handlers)
        if args.policy:
            from .integrations.mcp_cli import register_policy_compensators

            upstream = register_policy_compensators(args)
    except (ImportError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if not 1 <= args.concurrency <= 1000:
            raise ConfigurationError("--concurrency: from 1 to 1000")
        worker = Worker(name=args.name, lease_s=args.lease, wait_s=args.wait, concurrency=args.concurrency)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not worker.handler_names():
        print("error: the --handlers modules register no @sagaplane.compensator", file=sys.stderr)
        return EXIT_USAGE
    # The same modules' @sagaplane.reconciler observers answer reconciliation checks alongside.
    from .reconcile import ReconcileWorker, registered_reconcilers

    observer = None
    if registered_reconcilers():
        observer = ReconcileWorker(name=worker.name, wait_s=args.wait)
        threading.Thread(target=observer.run, name="sagaplane-reconciler", daemon=True).start()

    def stop(*_: Any) -> None:
        worker.stop()
        if observer is not None:
            observer.stop()

    signal.signal(signal.SIGTERM, stop)
    observing = f"; observing {', '.join(observer.handler_names())}" if observer is not None else ""
    handlers = ", ".join(worker.handler_names())
    print(f"sagaplane worker {worker.name}: handlers {handlers}{observing}", flush=True)
    try:
        ran = worker.run(max_jobs=args.max_jobs)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        if observer is not None:
            observer.stop()
        if upstream is not None:
            upstream.close()
    print(f"ran {ran} job(s)", flush=True)
    return EXIT_OK


SUBCOMMANDS: list[Callable[[Any], None]] = [
    add_ship,
    add_verify_wal,
    add_verify_disclosure,
    add_verify_export,
    add_verify_proof,
    add_verify_checkpoint,
    add_worker,
    add_reconcile,
    add_reconcile_worker,
    add_certify,
    add_verify_approval,
    add_witness,
    add_mcp_gateway,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sagaplane", description="Sagaplane agent SDK tools")
    parser.add_argument("--version", action="version", version=f"sagaplane {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
