"""Sign-in throttling hooks for django-axes (settings: AXES_USERNAME_CALLABLE, AXES_LOCKOUT_CALLABLE).

Axes counts failed sign-ins per account and per client address and refuses sign-ins while either
is over the limit; these two functions decide what an "account" is and what a refused person sees.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

# AccessAttempt.username is a 255-character column.
_USERNAME_LIMIT = 255


def attempted_username(request: HttpRequest, credentials: dict[str, Any] | None = None) -> str | None:
    """The account a sign-in tried, as accounts are named (e-mail addresses, lower case), so
    "Owner@x" and "owner@x " count against the same account."""
    raw = credentials.get("username") if credentials is not None else request.POST.get("username")
    if not isinstance(raw, str):
        return None
    return raw.replace("\x00", "").strip().lower()[:_USERNAME_LIMIT]


def cool_off_minutes() -> int:
    return int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)


def locked_out_response(request: HttpRequest, *_: Any) -> HttpResponse:
    """429 Too Many Requests with Retry-After: JSON in the API's error shape for clients that ask
    for JSON, else the sign-in page with the reason. Neither says which limit was hit (the account
    or the address), nor whether the account exists.

    Axes passes (request, response, credentials) or, from its async middleware, (request,
    credentials); neither is needed here."""
    minutes = cool_off_minutes()
    detail = f"too many failed sign-ins; try again in {minutes} minutes"
    accept = request.headers.get("Accept", "")
    if (
        request.path.startswith("/api/")
        or "application/json" in accept
        or request.headers.get("X-Requested-With") == "XMLHttpRequest"
    ):
        response: HttpResponse = JsonResponse(
            {"error": "locked_out", "detail": detail, "retry_after": minutes * 60}, status=429
        )
    else:
        response = render(
            request,
            "frontend/login.html",
            {"locked_out": True, "cool_off_minutes": minutes, "next": request.POST.get("next", "")},
            status=429,
        )
    response["Retry-After"] = str(minutes * 60)
    return response
