"""Passkeys in the dashboard: a member's own passkeys (list, register, rename, revoke) and the
sign-in page's "Sign in with a passkey".

The browser half is `static/frontend/passkeys.js`: it asks for options (JSON), calls
navigator.credentials.create() or .get(), and posts the credential back as a form field (so the
form is read before any transaction opens, like every other page). Every check is in
`passkeys.services`; a refusal is answered in the API's error shape {error, detail, field}.

A passkey sign-in is not counted by django-axes: an assertion cannot be guessed, and a person
whose password is being guessed can still sign in with their passkey while the password
sign-in is locked.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from core.numbers import ascii_int
from frontend.views import MemberRequest, actor_of, member_page, page
from passkeys import services
from passkeys.services import PasskeyRefused
from tenants.access import OWN_PASSKEYS


def _refusal(exc: PasskeyRefused) -> JsonResponse:
    return JsonResponse(exc.body(), status=exc.status)


# ------------------------------------------------------------------------------ own passkeys


@member_page({"GET": OWN_PASSKEYS})
def passkey_list(request: MemberRequest) -> HttpResponse:
    passkeys = list(request.user.passkeys.order_by("revoked_at", "created_at", "pk"))
    return page(
        request,
        "frontend/passkeys.html",
        {"passkeys": passkeys, "name_max": services.NAME_MAX, "rp_id": services.rp_id()},
        section="passkeys",
    )


@never_cache
@member_page({"POST": OWN_PASSKEYS})
def registration_options(request: MemberRequest) -> HttpResponse:
    return JsonResponse(services.registration_options(request.user))


@member_page({"POST": OWN_PASSKEYS})
def register(request: MemberRequest) -> HttpResponse:
    try:
        passkey = services.register(
            request.user,
            request.POST.get("name", ""),
            request.POST.get("credential", ""),
            origins=services.origins_for(request),
            actor=actor_of(request),
        )
    except PasskeyRefused as exc:
        return _refusal(exc)
    messages.success(request, f"Passkey '{passkey.name}' registered.")
    return JsonResponse({"id": passkey.pk, "name": passkey.name}, status=201)


def _passkey_id(request: MemberRequest) -> int | None:
    raw = request.POST.get("passkey", "")
    return ascii_int(raw)


@member_page({"POST": OWN_PASSKEYS})
def rename(request: MemberRequest) -> HttpResponse:
    """Another person's passkey, or none, is "no such passkey of yours": nothing changes."""
    passkey_id = _passkey_id(request)
    try:
        if passkey_id is None:
            raise PasskeyRefused("not_found", "no such passkey of yours", status=404, field="passkey")
        passkey = services.rename(
            request.user, passkey_id, request.POST.get("name", ""), actor=actor_of(request)
        )
    except PasskeyRefused as exc:
        messages.error(request, exc.detail)
        return redirect("passkeys")
    messages.success(request, f"Passkey renamed to '{passkey.name}'.")
    return redirect("passkeys")


@member_page({"POST": OWN_PASSKEYS})
def revoke(request: MemberRequest) -> HttpResponse:
    passkey_id = _passkey_id(request)
    try:
        if passkey_id is None:
            raise PasskeyRefused("not_found", "no such passkey of yours", status=404, field="passkey")
        passkey = services.revoke(request.user, passkey_id, actor=actor_of(request))
    except PasskeyRefused as exc:
        messages.error(request, exc.detail)
        return redirect("passkeys")
    messages.success(request, f"Passkey '{passkey.name}' revoked: it signs nothing from now on.")
    return redirect("passkeys")


# ----------------------------------------------------------------------------------- sign-in


@never_cache
@require_POST
def sign_in_options(request: HttpRequest) -> HttpResponse:
    if not services.sign_in_challenge_allowed(str(request.META.get("REMOTE_ADDR", ""))):
        response = JsonResponse(
            {"error": "rate_limited", "detail": "too many passkey sign-ins from this address; wait a minute"},
            status=429,
        )
        response["Retry-After"] = "60"
        return response
    return JsonResponse(services.sign_in_options())


@never_cache
@require_POST
def sign_in(request: HttpRequest) -> HttpResponse:
    try:
        user = services.sign_in(request.POST.get("credential", ""), origins=services.origins_for(request))
    except PasskeyRefused as exc:
        return _refusal(exc)
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return JsonResponse({"redirect": _next_url(request)})


def _next_url(request: HttpRequest) -> str:
    wanted: Any = request.POST.get("next", "")
    if isinstance(wanted, str) and url_has_allowed_host_and_scheme(
        wanted, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return wanted
    return str(settings.LOGIN_REDIRECT_URL)
