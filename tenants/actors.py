"""Who acts, built in one place: every `core.actors.Actor` comes from these functions (see
`core.actors` for the kinds and their stored forms)."""

from __future__ import annotations

import getpass
import os

from core.actors import Actor, ActorKind


def user_actor(username: str) -> Actor:
    """A person (signed in to the dashboard or the API), by their username."""
    return Actor(ActorKind.USER, username)


def slack_actor(username: str, slack_user_id: str) -> Actor:
    """A Slack user acting as the member they are linked to (stored as that person: one person
    has one name in the evidence whichever way they came in)."""
    return Actor(ActorKind.SLACK, username, display=f"{username} (Slack {slack_user_id})")


def invitation_actor(inviter_username: str) -> Actor:
    """Whoever accepts an invitation, recorded as the member who invited them."""
    return Actor(ActorKind.INVITATION, inviter_username)


def api_key_actor(prefix: str) -> Actor:
    """An API key, by its public prefix."""
    return Actor(ActorKind.API_KEY, prefix)


def system_actor(what: str) -> Actor:
    """Work the system does on its own account (`what` names the job)."""
    return Actor(ActorKind.SYSTEM, what)


def named_actor(name: str) -> Actor:
    """A constant name older records already use as it is (`gate`, `approvals-sweep`)."""
    return Actor(ActorKind.NAMED, name)


def agent_saga_actor(stream_id: str) -> Actor:
    """Records shipped in an agent-saga WAL, acted on as that stream."""
    return Actor(ActorKind.AGENT_SAGA, stream_id)


def cli_actor(login: str | None = None) -> Actor:
    """The operator running a management command, by their login name (None: this process's,
    or its uid when it has no name, as in some containers)."""
    if login is not None:
        return Actor(ActorKind.CLI, login)
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = f"uid{os.getuid()}"
    return Actor(ActorKind.CLI, name)
