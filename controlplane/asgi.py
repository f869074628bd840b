"""ASGI entry point: HTTP through Django, websockets through Channels (live dashboard events)."""

import os

from django.core.asgi import get_asgi_application

from controlplane.tracing import configure_tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
configure_tracing("sagaplane-web")  # before the middleware is loaded: it adds its own
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the app registry loaded above)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from controlplane.gate_asgi import lean_gate  # noqa: E402
from controlplane.routing import websocket_urlpatterns  # noqa: E402
from core.longpoll import abandon_when_done  # noqa: E402

application = ProtocolTypeRouter(
    {
        # The gate's calls in front of Django's stack (controlplane/gate_asgi.py); all else through
        # it, where a long-poll ends as soon as its request is over for the server (longpoll.py).
        "http": lean_gate(abandon_when_done(django_asgi_app)),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
