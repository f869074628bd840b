"""Who may keep listening to a tenant's live events (the dashboard's `ws/events` sockets).

A socket is checked when it opens; afterwards the tenancy side tells it to close when what it was
opened on goes away. Every socket joins two groups besides its tenant's: one per membership
(closed when the member is removed) and one per sign-in session (closed when that session signs
out). The messages are best effort (after the commit, never failing it); the consumer also
re-checks its session and membership from time to time, which covers a lost message."""

from __future__ import annotations

import hashlib

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth.signals import user_logged_out
from django.dispatch import receiver
from django.http import HttpRequest

from core.postcommit import after_commit

# The message type a consumer handles by closing itself (Channels maps "live.revoke" to the
# consumer method `live_revoke`).
REVOKE = "live.revoke"


def member_group(tenant_id: int, user_id: int) -> str:
    return f"member-{tenant_id}-{user_id}"


def session_group(session_key: str) -> str:
    # The session key is a credential: the group name (visible in Redis) carries a digest of it.
    return "session-" + hashlib.sha256(session_key.encode()).hexdigest()[:40]


def _close_group(group: str, reason: str) -> None:
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(group, {"type": REVOKE, "reason": reason})


def close_member_sockets(tenant_id: int, user_id: int) -> None:
    """After the current transaction commits, close this member's sockets on this tenant."""
    group = member_group(tenant_id, user_id)
    after_commit(f"close live sockets of {group}", lambda: _close_group(group, "membership_ended"))


def close_session_sockets(session_key: str) -> None:
    """After the current transaction commits (at once outside one), close the sockets opened
    with this sign-in session."""
    group = session_group(session_key)
    after_commit("close live sockets of a signed-out session", lambda: _close_group(group, "signed_out"))


@receiver(user_logged_out, dispatch_uid="core.live.signed_out")
def _on_signed_out(sender: object, request: HttpRequest | None = None, **kwargs: object) -> None:
    # Sent before the session is flushed, so its key still names the sockets it opened.
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if session_key:
        close_session_sockets(session_key)
