"""Websocket routes. Each app that publishes live events adds its consumer here."""

from django.urls import path

from sagas.consumers import TenantEventsConsumer

websocket_urlpatterns: list = [
    path("ws/events", TenantEventsConsumer.as_asgi()),
]
