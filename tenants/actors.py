"""Who acts, as audit records name them: the one place an actor string is built or read.

Requests name their person or key (`user:<name>`, `api-key:<prefix>`); an operator at a shell is
`cli:<login name>`; work the system starts on its own is `system:<what>`; an agent-saga WAL's
records are acted on as `agent-saga:<stream>`."""

from __future__ import annotations

import getpass
import os

USER = "user:"
API_KEY = "api-key:"


def user_actor(username: str) -> str:
    """A person (signed in to the dashboard or the API, or linked from Slack), by their username:
    one person has one name in the evidence whichever way they came in."""
    return f"{USER}{username}"


def api_key_actor(prefix: str) -> str:
    """An API key, by its public prefix."""
    return f"{API_KEY}{prefix}"


def system_actor(what: str) -> str:
    """Work the system does on its own account (`what` names the job)."""
    return f"system:{what}"


def agent_saga_actor(stream_id: str) -> str:
    """Records shipped in an agent-saga WAL, acted on as that stream."""
    return f"agent-saga:{stream_id}"


def cli_actor() -> str:
    """The operator running a management command, by their login name (the uid when the
    process has no name, as in some containers)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = f"uid{os.getuid()}"
    return f"cli:{name}"


def shown_name(actor: str) -> str:
    """How an actor is shown to people: a person by their name alone, anyone else as recorded."""
    return actor.removeprefix(USER)


def api_key_prefix_of(actor: str) -> str:
    """The key prefix of an API-key actor ("" for any other actor)."""
    return actor.removeprefix(API_KEY) if actor.startswith(API_KEY) else ""
