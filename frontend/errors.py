"""The console's answer to an error no view handled (`handler500`): a store that cannot be reached
is a 503 page that says so and asks to retry (the API's `control_plane_unavailable`, which an
API path gets in its error shape), and marks the store down as an API call would; any other error
is Django's own 500. The page is rendered without the request's context processors: they would
read the store again."""

from __future__ import annotations

import json
import sys

from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.views import defaults

from core import availability


def server_error(request: HttpRequest) -> HttpResponse:
    error = sys.exc_info()[1]
    refusal = availability.refusal_for(error) if error is not None else None
    if refusal is None:
        return defaults.server_error(request)
    if request.path.startswith("/api/"):
        response = HttpResponse(json.dumps(refusal.body()), status=503, content_type="application/json")
    else:
        page = render_to_string("frontend/503.html", {"store": refusal.store})
        response = HttpResponse(page, status=503)
    response["Retry-After"] = "1"
    return response
