"""Websocket routes. Each app that publishes live events adds its consumer here."""

websocket_urlpatterns: list = []
