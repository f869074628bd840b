"""Live events for the dashboard: one websocket per signed-in member, joined to their tenant's group."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from sagas.services import tenant_group
from tenants.permissions import SESSION_TENANT_KEY
from tenants.selectors import membership_for


class TenantEventsConsumer(AsyncJsonWebsocketConsumer):
    """`ws/events`: `saga.event` messages (new records per saga, saga state changes) of the tenant
    the member's session acts for. Anyone else is refused before the socket opens."""

    group: str | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        session = self.scope.get("session")
        slug = session.get(SESSION_TENANT_KEY) if session is not None else None
        membership = await database_sync_to_async(membership_for)(user, slug)
        if membership is None:
            await self.close(code=4404)
            return
        self.group = tenant_group(membership.tenant_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def saga_event(self, event: dict[str, Any]) -> None:
        await self.send_json(event)
