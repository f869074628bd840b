"""The Fleet page: the sagas' overview (`fleet_chart.fleet_overview`) and the gate's controls —
budget and rate-limit gauges over their windows, recent denials with their reasons, the kill
switches in force, the circuit breakers with their state and history — with the forms that
change them.

Every change goes through `fleet.services` (actor `user:<name>`), which validates it and records
it in the tenant's server stream; a refusal (`DomainError`) is shown beside the field it names, with
the form as it was typed, and changes nothing. Each route declares its rule with the same named
rules as the API (`tenants.access`): everyone sees, FLEET_CONTROL (owners, admins) changes budgets,
rate limits, circuit breakers and the lease TTL, FLEET_HALT (owners, admins, approvers) halts and resumes. The
controls are also a fragment (`fleet-controls`) that app.js fetches again every few seconds, so
the gauges move live.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone

from core.errors import DomainError
from core.numbers import ascii_int
from fleet import services
from fleet.gate import from_units, to_units
from fleet.models import BudgetLimit, CircuitBreaker, GateDecision, Halt, HaltMode, OnCap, RateLimit
from frontend.fleet_chart import fleet_overview
from frontend.views import MemberRequest, actor_of, member_page, page
from tenants.access import FLEET_CONTROL, FLEET_HALT, FLEET_VIEW, READ
from tenants.models import ROLE_CAPABILITIES

REFRESH_SECONDS = 3
DENIALS_SHOWN = 20
HISTORY_SHOWN = 10  # a breaker's latest transitions on the page (the API gives more)
RATE_RE = re.compile(r"[0-9]{1,3}(\.[0-9]{1,8})?")  # a failure rate as typed: "0.5", "1"
# Units a duration is typed in: (value, label, seconds).
UNITS = [("s", "seconds", 1), ("min", "minutes", 60), ("h", "hours", 3600), ("d", "days", 86400)]
UNIT_SECONDS = {value: seconds for value, _, seconds in UNITS}
HALT_SCOPES = [
    ("tool", "Tools matching"),
    ("agent", "Agent named"),
    ("tag", "Sagas tagged"),
    ("*", "Everything"),
]
PER_CHOICES = [("agent", "each agent"), ("api_key", "each API key"), ("tool", "each tool")]
NUMBER_MAX_CHARS = 40  # a form's number is parsed only when it is this short (no huge int() work)


@dataclass
class FormState:
    """A form shown again after a refusal: what was typed, and the message per field."""

    values: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ reading


def _amount(value: str) -> str:
    """'49950' → '49,950' (the ledger's decimal strings, grouped for reading)."""
    try:
        return format(Decimal(value), ",")
    except (InvalidOperation, ValueError):
        return value


def duration_label(seconds: int) -> str:
    for _, label, size in reversed(UNITS):
        if seconds % size == 0:
            n = seconds // size
            return f"{n} {label[:-1] if n == 1 else label}"
    return f"{seconds} seconds"


def _cap(limit: BudgetLimit) -> str:
    return from_units(to_units(limit.max_total))


def _gauge(usage: dict[str, Any]) -> dict[str, Any]:
    ratio = float(usage["ratio"])
    return {
        **usage,
        "used_text": _amount(str(usage["used"])),
        "cap_text": _amount(str(usage["cap"])),
        # Of what is used, units held by outstanding budget leases (counted whole until returned).
        "leased_text": _amount(str(usage.get("leased", "0"))) if usage.get("leased", "0") != "0" else "",
        "percent": min(100, round(ratio * 100)),
        "high": str(Decimal(str(usage["cap"])) * Decimal("0.8")),
        "level": "full" if ratio >= 0.999 else ("high" if ratio >= 0.8 else "ok"),
    }


def _empty_gauge(cap: Any) -> dict[str, Any]:
    return _gauge({"scope": "fleet", "used": "0", "cap": str(cap), "ratio": 0})


def _budget_rows() -> list[dict[str, Any]]:
    rows = []
    for limit in BudgetLimit.objects.order_by("name"):
        gauges = [_gauge(u) for u in services.budget_usage(limit)]
        cap = _cap(limit)
        rows.append(
            {
                "limit": limit,
                "cap_text": _amount(cap),
                "window": duration_label(limit.window_s),
                "per": ", ".join(limit.per) or "the whole fleet",
                # A fleet-wide budget always has its one gauge; a scoped one shows scopes that spent.
                "gauges": gauges or ([_empty_gauge(cap)] if not limit.per else []),
            }
        )
    return rows


def _rate_rows() -> list[dict[str, Any]]:
    rows = []
    for limit in RateLimit.objects.order_by("name"):
        gauges = [_gauge(u) for u in services.rate_usage(limit)]
        rows.append(
            {
                "limit": limit,
                "window": duration_label(limit.window_s),
                "per": ", ".join(limit.per) or "the whole fleet",
                "gauges": gauges or ([_empty_gauge(limit.max_calls)] if not limit.per else []),
            }
        )
    return rows


def _why(denial: GateDecision) -> str:
    """One sentence for a denial's reason and details."""
    d = denial.detail or {}
    reason = denial.reason
    if reason == "budget_exceeded":
        return (
            f"budget '{d.get('limit')}' ({d.get('scope')}): {_amount(str(d.get('requested')))} asked, "
            f"{_amount(str(d.get('remaining')))} left"
        )
    if reason == "rate_limited":
        return f"rate limit '{d.get('limit')}' ({d.get('scope')}), retry in {d.get('retry_after')} s"
    if reason in ("halted", "draining"):
        return f"kill switch {d.get('scope')}: {d.get('halt_reason')}"
    if reason == "invalid_argument":
        return str(d.get("message") or "an argument could not be counted")
    if reason in ("control_plane_unreachable", "gate_unreachable", "not_in_policy"):
        return str(d.get("message") or reason)  # the agent's SDK refused it on its own
    if reason == "quarantined":
        return "the saga is quarantined"
    if reason == "circuit_open":
        return f"circuit breaker '{d.get('breaker')}' is open ({d.get('scope')})"
    if reason == "limit_store_unavailable":
        return "the limit store could not be read: refused rather than risk overspend"
    return reason


def _halt_rows(now: datetime) -> list[dict[str, Any]]:
    # The template shows the TTL left against the same `now` the halts were read at.
    return [{"halt": halt} for halt in services.halts_in_force(now)]


def _breaker_rows() -> list[dict[str, Any]]:
    rows = []
    for breaker in CircuitBreaker.objects.order_by("name"):
        rows.append(
            {
                "breaker": breaker,
                "phase": services.breaker_phase(breaker),
                "rate_percent": format(breaker.failure_rate * 100, "f").rstrip("0").rstrip("."),
                "window": duration_label(breaker.window_s),
                "cool_down": duration_label(breaker.cool_down_s),
                "history": breaker.transitions.order_by("-at", "-pk")[:HISTORY_SHOWN],
            }
        )
    return rows


def controls_context(request: MemberRequest) -> dict[str, Any]:
    """What the live fragment shows (the tenant is active: every read is scoped to it)."""
    now = timezone.now()
    denials = [{"d": d, "why": _why(d)} for d in services.recent_denials(DENIALS_SHOWN)]
    return {
        "budgets": _budget_rows(),
        "rates": _rate_rows(),
        "halts": _halt_rows(now),
        "breakers": _breaker_rows(),
        "denials": denials,
        "caps": ROLE_CAPABILITIES[request.membership.role],
        "now": now,
    }


def _fleet_page(
    request: MemberRequest, forms: dict[str, FormState] | None = None, status: int = 200
) -> HttpResponse:
    context = {
        **fleet_overview(request),
        **controls_context(request),
        "forms": forms or {},
        "units": UNITS,
        "halt_scopes": HALT_SCOPES,
        "halt_modes": HaltMode.choices,
        "on_cap_choices": OnCap.choices,
        "per_choices": PER_CHOICES,
        "controls_url": reverse("fleet-controls"),
        "refresh_seconds": REFRESH_SECONDS,
        "gate_settings": services.fleet_settings_values(request.tenant),
    }
    return page(request, "frontend/fleet.html", context, section="fleet", status=status)


@member_page({"GET": READ}, section="fleet")
def fleet(request: MemberRequest) -> HttpResponse:
    return _fleet_page(request)


@member_page({"GET": FLEET_VIEW}, section="fleet")
def fleet_controls(request: MemberRequest) -> HttpResponse:
    return render(request, "frontend/_fleet_controls.html", controls_context(request))


# ------------------------------------------------------------------------------------ parsing
# The forms are the API's commands (fleet.inputs) typed in a page: what is presentation only
# (a duration in units, checkboxes and a comma-separated list, a scope in two inputs) becomes the
# command's body here, and the command's own input checks it.


def _whole(value: str) -> int | str:
    """A typed whole number as an int, else as typed (the command refuses it, naming its field)."""
    number = ascii_int(value.strip(), max_digits=NUMBER_MAX_CHARS)
    return value if number is None else number


def _duration(post: Any, prefix: str, field_name: str, code: str, *, required: bool) -> int | str | None:
    """'<prefix>' (a whole number) in '<prefix>_unit' as seconds; None when optional and blank."""
    amount = post.get(prefix, "").strip()
    if not amount and not required:
        return None
    unit = post.get(f"{prefix}_unit", "s")
    if unit not in UNIT_SECONDS:
        raise DomainError(code, "choose a unit: seconds, minutes, hours or days", field=field_name)
    number = _whole(amount)
    return number * UNIT_SECONDS[unit] if isinstance(number, int) else number


def _per(post: Any) -> list[str]:
    per = [value for value, _ in PER_CHOICES if value in post.getlist("per")]
    arguments = [a.strip() for a in post.get("per_args", "").split(",") if a.strip()]
    return per + [f"arg:{a}" for a in arguments]


def _refused(request: MemberRequest, form: str, exc: DomainError) -> HttpResponse:
    state = FormState(values=request.POST.dict(), errors={str(exc.field): exc.detail})
    state.values["per"] = request.POST.getlist("per")
    return _fleet_page(request, {form: state}, status=exc.status)


def _done(request: MemberRequest, text: str) -> HttpResponse:
    messages.success(request, text)
    return redirect(reverse("fleet") + "#gate")


# ------------------------------------------------------------------------------------ changing


def _budget_body(post: Any, name: str | None = None) -> dict[str, Any]:
    """The budget form as the API's body (an Edit keeps the budget's name)."""
    return {
        "name": name if name is not None else post.get("name", "").strip(),
        "tool": post.get("tool", "").strip(),
        "argument": post.get("argument", "").strip(),
        "max_total": post.get("max_total", "").strip().replace(",", ""),
        "window_s": _duration(post, "window", "window_s", "invalid_window", required=True),
        "per": _per(post),
        "on_cap": post.get("on_cap", OnCap.DENY),
    }


def _budget_text(limit: BudgetLimit) -> str:
    return (
        f"at most {_amount(_cap(limit))} of {limit.argument} per "
        f"{duration_label(limit.window_s)} on {limit.tool}"
    )


@member_page({"POST": FLEET_CONTROL}, section="fleet")
def budget_create(request: MemberRequest) -> HttpResponse:
    try:
        budget = services.BudgetCreate.parse(_budget_body(request.POST))
        limit = services.create_budget(request.tenant, budget, actor=actor_of(request))
    except DomainError as exc:
        return _refused(request, "budget", exc)
    return _done(request, f"Budget '{limit.name}' set: {_budget_text(limit)}.")


def _window_values(seconds: int) -> dict[str, str]:
    """A window as the form asks it: in the largest unit that divides it."""
    for value, _, size in reversed(UNITS):
        if seconds % size == 0:
            return {"window": str(seconds // size), "window_unit": value}
    return {"window": str(seconds), "window_unit": "s"}


def _per_values(per: list[str]) -> dict[str, Any]:
    fixed = [p for p in per if not p.startswith("arg:")]
    arguments = [p.removeprefix("arg:") for p in per if p.startswith("arg:")]
    return {"per": fixed, "per_args": ", ".join(arguments)}


def _edit_page(
    request: MemberRequest, kind: str, limit: BudgetLimit | RateLimit, state: FormState, status: int = 200
) -> HttpResponse:
    budget = isinstance(limit, BudgetLimit)
    context = {
        "kind": kind,
        "kind_label": "budget" if budget else "rate limit",
        "editing": limit,
        "now_text": _budget_text(limit) if isinstance(limit, BudgetLimit) else _rate_text(limit),
        "f": state,
        "action": reverse(f"fleet-{'budget' if budget else 'rate-limit'}-edit", args=[limit.pk]),
        "units": UNITS,
        "per_choices": PER_CHOICES,
        "on_cap_choices": OnCap.choices,
    }
    return page(request, "frontend/fleet_limit_edit.html", context, section="fleet", status=status)


def _edit_refused(request: MemberRequest, kind: str, limit: Any, exc: DomainError) -> HttpResponse:
    state = FormState(values=request.POST.dict(), errors={str(exc.field): exc.detail})
    state.values["per"] = request.POST.getlist("per")
    return _edit_page(request, kind, limit, state, status=exc.status)


@member_page({"GET": FLEET_CONTROL, "POST": FLEET_CONTROL}, section="fleet")
def budget_edit(request: MemberRequest, budget_id: int) -> HttpResponse:
    """A budget's terms in its form; saving sets them (its name stays)."""
    limit = BudgetLimit.objects.filter(pk=budget_id).first()  # another tenant's id: not found
    if limit is None:
        raise Http404("no such budget")
    if request.method != "POST":
        values = {
            "tool": limit.tool,
            "argument": limit.argument,
            "max_total": _cap(limit),
            "on_cap": limit.on_cap,
            **_window_values(limit.window_s),
            **_per_values(list(limit.per)),
        }
        return _edit_page(request, "budget", limit, FormState(values=values))
    try:
        budget = services.BudgetCreate.parse(_budget_body(request.POST, limit.name))
        changed = services.update_budget(request.tenant, limit.pk, budget, actor=actor_of(request))
    except DomainError as exc:
        return _edit_refused(request, "budget", limit, exc)
    return _done(request, f"Budget '{changed.name}' saved: {_budget_text(changed)}.")


@member_page({"GET": FLEET_CONTROL, "POST": FLEET_CONTROL}, section="fleet")
def rate_limit_edit(request: MemberRequest, rate_limit_id: int) -> HttpResponse:
    """A rate limit's terms in its form; saving sets them (its name stays)."""
    limit = RateLimit.objects.filter(pk=rate_limit_id).first()
    if limit is None:
        raise Http404("no such rate limit")
    if request.method != "POST":
        values = {
            "tool": limit.tool,
            "max_calls": str(limit.max_calls),
            **_window_values(limit.window_s),
            **_per_values(list(limit.per)),
        }
        return _edit_page(request, "rate", limit, FormState(values=values))
    try:
        rate_limit = services.RateLimitCreate.parse(_rate_body(request.POST, limit.name))
        changed = services.update_rate_limit(request.tenant, limit.pk, rate_limit, actor=actor_of(request))
    except DomainError as exc:
        return _edit_refused(request, "rate", limit, exc)
    return _done(request, f"Rate limit '{changed.name}' saved: {_rate_text(changed)}.")


@member_page({"POST": FLEET_CONTROL}, section="fleet")
def budget_delete(request: MemberRequest, budget_id: int) -> HttpResponse:
    limit = BudgetLimit.objects.filter(pk=budget_id).first()  # another tenant's id: not found
    if limit is None:
        raise Http404("no such budget")
    services.delete_budget(request.tenant, limit.pk, actor=actor_of(request))
    return _done(request, f"Budget '{limit.name}' deleted.")


def _rate_body(post: Any, name: str | None = None) -> dict[str, Any]:
    """The rate-limit form as the API's body (an Edit keeps the rate limit's name)."""
    return {
        "name": name if name is not None else post.get("name", "").strip(),
        "tool": post.get("tool", "").strip(),
        "max_calls": _whole(post.get("max_calls", "")),
        "window_s": _duration(post, "window", "window_s", "invalid_window", required=True),
        "per": _per(post),
    }


def _rate_text(limit: RateLimit) -> str:
    return f"at most {limit.max_calls} calls per {duration_label(limit.window_s)} on {limit.tool}"


@member_page({"POST": FLEET_CONTROL}, section="fleet")
def rate_limit_create(request: MemberRequest) -> HttpResponse:
    try:
        rate_limit = services.RateLimitCreate.parse(_rate_body(request.POST))
        limit = services.create_rate_limit(request.tenant, rate_limit, actor=actor_of(request))
    except DomainError as exc:
        return _refused(request, "rate", exc)
    return _done(request, f"Rate limit '{limit.name}' set: {_rate_text(limit)}.")


@member_page({"POST": FLEET_CONTROL}, section="fleet")
def rate_limit_delete(request: MemberRequest, rate_limit_id: int) -> HttpResponse:
    limit = RateLimit.objects.filter(pk=rate_limit_id).first()
    if limit is None:
        raise Http404("no such rate limit")
    services.delete_rate_limit(request.tenant, limit.pk, actor=actor_of(request))
    return _done(request, f"Rate limit '{limit.name}' deleted.")


@member_page({"POST": FLEET_HALT}, section="fleet")
def halt_create(request: MemberRequest) -> HttpResponse:
    post = request.POST
    kind = post.get("scope_kind", "")
    value = post.get("scope_value", "").strip()
    scope = "*" if kind == "*" else f"{kind}:{value}"
    try:
        halt = services.HaltCreate.parse(
            {
                "scope": scope,
                "mode": post.get("mode", HaltMode.HALT),
                "reason": post.get("reason", "").strip(),
                "ttl_s": _duration(post, "ttl", "ttl_s", "invalid_ttl", required=False),
            }
        )
        row = services.halt(request.tenant, halt, actor=actor_of(request))
    except DomainError as exc:
        return _refused(request, "halt", exc)
    ttl = row.expires_at - row.created_at if row.expires_at else None
    until = f" for {duration_label(round(ttl.total_seconds()))}" if ttl else ""
    return _done(request, f"{row.get_mode_display().split(':')[0]} in force on {row.scope}{until}.")


@member_page({"POST": FLEET_HALT}, section="fleet")
def halt_resume(request: MemberRequest, halt_id: int) -> HttpResponse:
    row = Halt.objects.filter(pk=halt_id).first()
    if row is None:
        raise Http404("no such halt")
    lifted = services.resume(request.tenant, row.pk, actor=actor_of(request))
    if lifted is None:
        messages.info(request, f"The halt on {row.scope} was no longer in force.")
        return redirect(reverse("fleet") + "#gate")
    return _done(request, f"Resumed: {row.scope} is no longer halted.")


def _rate(value: str) -> str:
    """The form's failure rate, typed in percent ("50" → "0.5"); what is not a plain number is
    handed on as typed, for the command to refuse by name."""
    value = value.strip().rstrip("%").strip()
    if not RATE_RE.fullmatch(value):
        return value
    return format(Decimal(value) / 100, "f")


@member_page({"POST": FLEET_CONTROL}, section="fleet")
def breaker_create(request: MemberRequest) -> HttpResponse:
    post = request.POST
    try:
        breaker = services.BreakerCreate.parse(
            {
                "name": post.get("name", "").strip(),
                "tool": post.get("tool", "").strip(),
                "consecutive_failures": _whole(post.get("consecutive_failures", "")),
                "failure_rate": _rate(post.get("failure_rate", "")),
                "min_volume": _whole(post.get("min_volume", "")),
                "window_s": _duration(post, "window", "window_s", "invalid_window", required=True),
                "cool_down_s": _duration(
                    post, "cool_down", "cool_down_s", "invalid_cool_down", required=True
                ),
            }
        )
        created = services.create_breaker(request.tenant, breaker, actor=actor_of(request))
    except DomainError as exc:
        return _refused(request, "breaker", exc)
    return _done(
        request,
        f"Circuit breaker '{created.name}' set on {created.tool}: opens after "
        f"{created.consecutive_failures} failures in a row or "
        f"{format(created.failure_rate * 100, 'f').rstrip('0').rstrip('.')}% of at least "
        f"{created.min_volume} calls over {duration_label(created.window_s)}.",
    )


@member_page({"POST": FLEET_CONTROL}, section="fleet")
def breaker_delete(request: MemberRequest, breaker_id: int) -> HttpResponse:
    breaker = CircuitBreaker.objects.filter(pk=breaker_id).first()  # another tenant's id: not found
    if breaker is None:
        raise Http404("no such breaker")
    services.delete_breaker(request.tenant, breaker.pk, actor=actor_of(request))
    return _done(request, f"Circuit breaker '{breaker.name}' deleted.")


@member_page({"POST": FLEET_CONTROL}, section="fleet")
def settings_update(request: MemberRequest) -> HttpResponse:
    """The lease TTL, typed in milliseconds (blank: the default)."""
    typed = request.POST.get("lease_ttl_ms", "").strip().replace(",", "")
    try:
        change = services.FleetSettingsUpdate.parse({"lease_ttl_ms": _whole(typed) if typed else None})
        now = services.set_fleet_settings(request.tenant, change, actor=actor_of(request))
    except DomainError as exc:
        return _refused(request, "settings", exc)
    chosen = "the default, " if now["lease_ttl_ms"] is None else ""
    return _done(
        request, f"Budget leases now live {chosen}{now['lease_ttl_ms_effective']} ms unless renewed."
    )
