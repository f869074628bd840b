"""Sagas, fleet and evidence pages (filled in as the sagas and transparency apps land)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from frontend.views import member_page, page


@member_page("read", section="sagas")
def saga_list(request: HttpRequest) -> HttpResponse:
    return page(request, "frontend/sagas.html", {"sagas": []}, section="sagas")


@member_page("read", section="fleet")
def fleet(request: HttpRequest) -> HttpResponse:
    return page(request, "frontend/fleet.html", {}, section="fleet")


@member_page("audit", section="evidence")
def evidence(request: HttpRequest) -> HttpResponse:
    return page(request, "frontend/evidence.html", {}, section="evidence")
