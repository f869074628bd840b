"""Live events for the dashboard: one websocket per signed-in member, joined to their tenant's group."""

from __future__ import annotations

import json
import time
from importlib import import_module
from typing import Any, ClassVar

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib import auth
from django.contrib.sessions.backends.base import SessionBase
from django.http import HttpRequest

from core import live
from sagas.services import tenant_group
from tenants.permissions import SESSION_TENANT_KEY
from tenants.selectors import membership_for

# Close codes (4000-4999 are the application's own; the dashboard reconnects and is refused).
NOT_SIGNED_IN = 4401
NOT_ALLOWED = 4403  # the membership ended or the session signed out while the socket was open
NOT_A_MEMBER = 4404
UNSUPPORTED_DATA = 1003  # RFC 6455: a frame type the endpoint cannot accept (binary)
INVALID_PAYLOAD = 1007  # RFC 6455: data inconsistent with the message type (text that is not JSON)


def _request_with(session: SessionBase) -> HttpRequest:
    """A request carrying only `session`: all `django.contrib.auth.get_user` reads."""
    request = HttpRequest()
    request.session = session
    return request


class TenantEventsConsumer(AsyncJsonWebsocketConsumer):
    """`ws/events`: `saga.event` messages (new records per saga, saga state changes) of the tenant
    the member's session acts for. Anyone else is refused before the socket opens.

    An open socket is closed (4403) and hears nothing more once its member is removed from the
    tenant or its session signs out: `core.live` sends it a `live.revoke` message after that
    change commits. Should that message be lost, the session and membership are read again before
    an event is forwarded, at most every `recheck_seconds`. The client has nothing to say: a frame
    it sends that is not JSON text closes the socket (1003/1007) instead of raising."""

    recheck_seconds: ClassVar[float] = 30.0

    groups_joined: list[str]
    revoked: bool = False  # closed (by either side): nothing more is sent
    next_check: float = 0.0

    async def connect(self) -> None:
        self.groups_joined = []
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=NOT_SIGNED_IN)
            return
        session = self.scope.get("session")
        slug = session.get(SESSION_TENANT_KEY) if session is not None else None
        membership = await database_sync_to_async(membership_for)(user, slug)
        if membership is None or session is None or not session.session_key:
            await self.close(code=NOT_A_MEMBER)
            return
        self.session_key: str = session.session_key
        self.tenant_slug: str = membership.tenant.slug
        # Join the groups that can close this socket before the one that feeds it, then look
        # again: a removal or sign-out that committed in between is seen either way.
        for group in (live.member_group(membership.tenant_id, user.pk), live.session_group(self.session_key)):
            await self._join(group)
        if not await database_sync_to_async(self._still_entitled)():
            await self._revoke()
            return
        await self._join(tenant_group(membership.tenant_id))
        self.next_check = time.monotonic() + self.recheck_seconds
        await self.accept()

    async def _join(self, group: str) -> None:
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined.append(group)

    async def _leave_groups(self) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = []

    def _still_entitled(self) -> bool:
        """The session still signs in the same person (not flushed, password unchanged, account
        active) and they can still read the tenant the socket was opened for."""
        session = import_module(settings.SESSION_ENGINE).SessionStore(self.session_key)
        user = auth.get_user(_request_with(session))
        if not user.is_authenticated or user.pk != self.scope["user"].pk:
            return False
        membership = membership_for(user, self.tenant_slug)
        return membership is not None and membership.can("read")

    async def _revoke(self) -> None:
        await self._shut(NOT_ALLOWED)

    async def _shut(self, code: int) -> None:
        """Leave every group first (nothing more can arrive), then close. An event already on its
        way is dropped (`saga_event`): the server refuses a send on a socket the consumer closed."""
        self.revoked = True
        await self._leave_groups()
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        self.revoked = True
        await self._leave_groups()

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        if text_data is None:
            await self._shut(UNSUPPORTED_DATA)
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):
            await self._shut(INVALID_PAYLOAD)
            return
        await self.receive_json(content, **kwargs)

    async def live_revoke(self, message: dict[str, Any]) -> None:
        await self._revoke()

    async def approval_event(self, event: dict[str, Any]) -> None:
        """`approval.event` (approvals.services): a request opened, voted on, decided, warned,
        escalated or consumed — forwarded like a saga event (the queue page updates live)."""
        await self.saga_event(event)

    async def saga_event(self, event: dict[str, Any]) -> None:
        if self.revoked:
            return
        if time.monotonic() >= self.next_check:
            if not await database_sync_to_async(self._still_entitled)():
                await self._revoke()
                return
            self.next_check = time.monotonic() + self.recheck_seconds
        await self.send_json(event)
