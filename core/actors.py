"""Who acts: the `Actor` value actions take as their keyword-only `actor`, and its stored form.

An `Actor` is its kind (a person, an API key, a Slack user acting as their linked member, work the
system does on its own account, an operator at a shell, an agent-saga WAL's stream, whoever
accepts an invitation, or a constant name), its id and how to show it. It is built only by the
functions of `tenants/actors.py`. `str(actor)` renders the string audit records have always
stored: `user:<name>` (a person, also when they came through Slack: one person has one name in
the evidence), `user:<inviter> (invitation)`, `api-key:<prefix>` (SDK and recovery workers too: a
worker acts as its key), `system:<what>`, `cli:<login name>`, `agent-saga:<stream>`, or the bare
constant name (`gate`, `approvals-sweep`). Stored actors are read back by `shown_name` and
`api_key_prefix_of` only. In `core` because the action-audit writer (`core.actionaudit`), which
imports no app, renders it."""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass

USER = "user:"
API_KEY = "api-key:"


class ActorKind(enum.Enum):
    """Who acts, by kind (each kind's stored form: `_STORED`)."""

    USER = "user"
    API_KEY = "api-key"
    SLACK = "slack"  # a Slack user acting as their linked member: stored as that person
    SYSTEM = "system"
    CLI = "cli"
    AGENT_SAGA = "agent-saga"
    INVITATION = "invitation"  # a person joining by an invitation, recorded as its inviter's
    NAMED = "named"  # a constant name recorded as it is


# Each kind's stored form (SLACK is stored as USER is: one person has one name in the evidence).
_STORED = {
    ActorKind.USER: USER + "{}",
    ActorKind.API_KEY: API_KEY + "{}",
    ActorKind.SLACK: USER + "{}",
    ActorKind.SYSTEM: "system:{}",
    ActorKind.CLI: "cli:{}",
    ActorKind.AGENT_SAGA: "agent-saga:{}",
    ActorKind.INVITATION: USER + "{} (invitation)",
    ActorKind.NAMED: "{}",
}


@dataclass(frozen=True)
class Actor:
    """Who acts. `str(actor)` is its stored form (audit records, the columns naming who did what)."""

    kind: ActorKind
    id: str
    display: str = ""

    def __str__(self) -> str:
        return _STORED[self.kind].format(self.id)


def stored(actor: Actor) -> str:
    """`actor`'s stored form, for the places that store who acted (the action-audit writer, the
    columns naming who did what). Anything but an `Actor` is a TypeError naming the function that
    was handed it: a plain string would bypass the builders of `tenants/actors.py`."""
    if type(actor) is not Actor:
        caller = sys._getframe(1)
        where = f"{caller.f_globals.get('__name__', '?')}.{caller.f_code.co_qualname}"
        raise TypeError(
            f"{where}: actor must be a core.actors.Actor (built by tenants/actors.py), "
            f"not {type(actor).__name__} {str(actor)[:60]!r}"
        )
    return str(actor)


def shown_name(actor: Actor | str) -> str:
    """How an actor is shown to people: its `display` when it has one; else a person by their
    name alone, anyone else as recorded (a stored actor string is read the same way)."""
    if isinstance(actor, Actor) and actor.display:
        return actor.display
    return str(actor).removeprefix(USER)


def api_key_prefix_of(actor: Actor | str) -> str:
    """The key prefix of an API-key actor ("" for any other actor)."""
    stored = str(actor)
    return stored.removeprefix(API_KEY) if stored.startswith(API_KEY) else ""
