"""The command line of the MCP integration: `sagaplane mcp-gateway`, and the upstream options
`sagaplane worker --policy FILE -- UPSTREAM` shares with it. Importing this module imports no
optional dependency; the commands import the `mcp` package when they run."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from ..semantics import IRREVERSIBLE
from .policy import Policy, PolicyError, load

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MISSING = "the MCP integration needs the mcp package: pip install 'sagaplane[mcp]'"
logger = logging.getLogger("sagaplane.mcp")


def add_upstream_options(p: Any) -> None:
    p.add_argument("--upstream-url", default=None, help="the upstream MCP server's streamable HTTP URL")
    p.add_argument(
        "--upstream-header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a header sent to the upstream URL (the gateway's own credentials; repeatable)",
    )
    p.add_argument("--call-timeout", type=float, default=120.0, help="seconds an upstream call may take")
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=8 << 20,
        help="the largest upstream message taken (default 8 MiB)",
    )
    p.add_argument(
        "upstream",
        nargs=argparse.REMAINDER,
        help="-- UPSTREAM_COMMAND [ARGS...]: an upstream server over stdio",
    )


def upstream_spec(args: argparse.Namespace) -> Any:
    """The upstream from the options, or a usage error (ValueError)."""
    from .mcp_upstream import UpstreamSpec

    command = list(args.upstream or [])
    if command and command[0] == "--":
        command = command[1:]
    if bool(command) == bool(args.upstream_url):
        raise ValueError("give the upstream as -- COMMAND [ARGS...] or --upstream-url URL (one of them)")
    headers = {}
    for item in args.upstream_header:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--upstream-header {item!r}: NAME=VALUE")
        headers[name.strip()] = value
    if not 1024 <= args.max_message_bytes <= 1 << 30:
        raise ValueError("--max-message-bytes: from 1024 to 1 GiB")
    return UpstreamSpec(
        command=command,
        url=args.upstream_url or "",
        headers=headers,
        max_message_bytes=args.max_message_bytes,
    )


def add_mcp_gateway(sub: Any) -> None:
    p = sub.add_parser(
        "mcp-gateway",
        help="govern an MCP server's tool calls: sagaplane mcp-gateway --policy FILE -- UPSTREAM_COMMAND",
    )
    p.add_argument("--policy", default=None, help="the tool policy file (TOML)")
    p.add_argument(
        "--listen", default=None, metavar="HOST:PORT", help="serve streamable HTTP (default: stdio)"
    )
    p.add_argument("--boundary", choices=("session", "explicit", "none"), default="session")
    p.add_argument("--observe", action="store_true", help="forward every call and record the tool surface")
    p.add_argument("--emit-policy", default=None, metavar="FILE", help="with --observe: write a policy")
    p.add_argument("--name", default=None, help="the tool source's name in observe mode without a policy")
    p.add_argument("--wal", default=None, help="WAL file (default $SAGAPLANE_WAL_DIR/mcp-gateway-<name>.wal)")
    p.add_argument(
        "--listen-token-env",
        default="SAGAPLANE_GATEWAY_TOKEN",
        metavar="VAR",
        help="with --listen: the environment variable holding the bearer token clients must send "
        "(required when listening beyond loopback)",
    )
    p.add_argument(
        "--session-idle",
        type=float,
        default=1800.0,
        help="with --listen: seconds without a call after which a session counts as dropped and its "
        "saga is left to recovery (default 1800, the mcp package's own idle timeout)",
    )
    p.add_argument("--lease-ttl", type=float, default=30.0, help="seconds until recovery takes over")
    add_upstream_options(p)
    p.set_defaults(func=cmd_mcp_gateway)


def _policy(args: argparse.Namespace) -> Policy:
    if args.policy:
        policy = load(args.policy)
        if args.observe:
            return Policy(policy.name, IRREVERSIBLE, (), policy.path)
        return policy
    if not args.observe:
        raise PolicyError("--policy", 0, "required (or --observe to record the tool surface first)")
    return Policy(args.name or "observed", IRREVERSIBLE, (), "<observe>")


def _listen(value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen {value!r}: HOST:PORT")
    return host or "127.0.0.1", int(port)


def _open_runtime(args: argparse.Namespace, name: str) -> Any:
    """sagaplane.configure with the gateway's WAL: the named one, or the default, or (when another
    gateway of this policy holds the default) one of this process' own."""
    from ..runtime import configure
    from ..wal import WALLocked

    agent = os.environ.get("SAGAPLANE_AGENT") or f"mcp-gateway-{name}"[:100]
    if args.wal:
        return configure(args.wal, agent=agent)
    folder = Path(os.environ.get("SAGAPLANE_WAL_DIR") or ".")
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return configure(folder / f"mcp-gateway-{name}.wal", agent=agent)
    except WALLocked:
        return configure(folder / f"mcp-gateway-{name}-{os.getpid()}.wal", agent=agent)


def cmd_mcp_gateway(args: argparse.Namespace) -> int:
    try:
        import anyio

        from .mcp_gateway import Gateway, GatewayConfig, serve
    except ImportError:
        print(f"error: {MISSING}", file=sys.stderr)
        return EXIT_USAGE
    from ..client import ConfigurationError

    try:
        policy = _policy(args)
        config = GatewayConfig(
            policy=policy,
            upstream=upstream_spec(args),
            boundary=args.boundary,
            observe=args.observe,
            emit_policy=Path(args.emit_policy) if args.emit_policy else None,
            call_timeout=args.call_timeout,
            lease_ttl=args.lease_ttl,
            session_idle=args.session_idle,
            saga_name=f"mcp-{policy.name}",
        )
        listen = _listen(args.listen)
        config.listen_token = os.environ.get(args.listen_token_env, "") if listen else ""
        if listen and not config.listen_token and listen[0] not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(
                f"--listen {args.listen}: beyond loopback the gateway needs a client token "
                f"(set ${args.listen_token_env}); it would otherwise lend its credentials to anyone"
            )
        if args.emit_policy and not args.observe:
            raise ValueError("--emit-policy needs --observe")
        runtime = _open_runtime(args, policy.name)
    except (PolicyError, ValueError, ConfigurationError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if runtime.gate is not None:
        runtime.gate.approval_wait = 5.0  # a progress notification at least this often while waiting
    gateway = Gateway(config, runtime.wal)
    logger.info(
        "mcp-gateway %s: upstream %s, boundary %s", policy.name, config.upstream.describe(), args.boundary
    )
    try:
        anyio.run(serve, gateway, listen)
    except KeyboardInterrupt:
        pass
    finally:
        runtime.close()
    return EXIT_OK


def register_policy_compensators(args: argparse.Namespace) -> Any:
    """For `sagaplane worker --policy FILE -- UPSTREAM`: the policy's compensators, run through
    the upstream. Returns what to close when the worker stops."""
    try:
        from .mcp_upstream import UpstreamThread, compensation_runner
    except ImportError:
        raise ValueError(MISSING) from None
    from .core import register_compensators

    policy = load(args.policy)
    thread = UpstreamThread(upstream_spec(args), call_timeout=args.call_timeout)
    register_compensators(policy, compensation_runner(thread.call))
    return thread
