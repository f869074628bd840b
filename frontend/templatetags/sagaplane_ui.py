"""Small presentation helpers: relative times with the absolute one on hover, absolute times,
amounts with their currency, short hashes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince, timeuntil

from core.numbers import amount_text
from tenants.models import ROLE_CAPABILITIES, Role

register = template.Library()


def _as_datetime(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, tz=UTC)
    if isinstance(value, str) and value:
        # The services' values carry times as ISO text (`vote_values`, `request_values`).
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def relative_text(when: datetime, now: datetime | None = None) -> str:
    now = now or timezone.now()
    if abs((now - when).total_seconds()) < 45:
        return "just now"
    if when <= now:
        return f"{timesince(when, now, depth=1)} ago"
    return f"in {timeuntil(when, now, depth=1)}"


@register.filter
def reltime(value: Any, empty: str = "never") -> str:
    """`<time datetime=ISO title=absolute>3 minutes ago</time>`; app.js keeps the text current."""
    when = _as_datetime(value)
    if when is None:
        return format_html('<span class="muted">{}</span>', empty)
    when = when if timezone.is_aware(when) else timezone.make_aware(when)
    absolute = when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return format_html(
        '<time datetime="{}" title="{}" data-relative>{}</time>',
        when.isoformat(),
        absolute,
        relative_text(when),
    )


@register.filter
def abstime(value: Any, empty: str = "—") -> str:
    """The absolute time, UTC, to the second (beside a relative one: an audit reads both)."""
    when = _as_datetime(value)
    if when is None:
        return empty
    when = when if timezone.is_aware(when) else timezone.make_aware(when)
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@register.filter
def money(value: Any, currency: Any = None) -> str:
    """`25000` -> `25,000`, with the currency code after it when the call named one
    (`25,000.50 EUR`); anything that is not a number is shown as it is, `—` for none."""
    return amount_text(value, currency)


@register.filter
def short_hash(value: Any, length: int = 12) -> str:
    text = str(value or "")
    return text[:length] + "…" if len(text) > length else text


@register.filter
def who_may(capability: Any) -> str:
    """The roles that have `capability`, as a sentence names them: `fleet` -> "owners and admins"
    (read from `tenants.models.ROLE_CAPABILITIES`, the one table of who may do what)."""
    roles = [f"{label.lower()}s" for value, label in Role.choices if capability in ROLE_CAPABILITIES[value]]
    if len(roles) < 2:
        return "".join(roles) or "nobody"
    return ", ".join(roles[:-1]) + " and " + roles[-1]


@register.filter
def event_label(value: Any) -> str:
    """A record's event as a person reads it: `SAGA_SEALED` -> `saga sealed`."""
    return str(value or "—").replace("_", " ").lower()


@register.filter
def spaced(value: Any) -> str:
    """`rollback_partial` -> `rollback partial`."""
    return str(value or "").replace("_", " ")


@register.filter
def argvalue(value: Any) -> str:
    """An argument's value as a person reads it, not as Python prints it: a string as itself, no
    value as "none", anything else as JSON (`true`, `[1, 2]`, `{"a": 1}`)."""
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
