"""The console's one way to page a list: keyset pages of a bounded size in a stable order (a time,
then the primary key to break ties), with First page / Previous / Next links that carry the list's filters.

A page link is `before=<ISO time>~<id>` (the rows after the cursor in the list's order: Next) or
`after=<ISO time>~<id>` (the rows before it: Previous). Anything else in either parameter — a negative,
a word, a huge number, a time without a zone — is the first page (a person's stale or mangled link
still lands on the list, never on an error). Offsets are not used: a page stays the same rows while
new ones arrive, and a deep page costs what the first costs (the index on the time serves both).

Lists whose selector takes a cursor (`fleet.selectors.denials`, `halt_history`) read it with
`cursor(...)` and link with `links(...)`; a queryset is paged whole by `keyset(...)`. A page with
several lists (Recovery) names each one's parameters (`queue_before=`, ...) and passes the others'
in `query`, so paging one list keeps the others where they were; a list read oldest first (the
human queue) pages the same way in that order (`ascending`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest

from core.numbers import ascii_int

PAGE_SIZE = 50
CURSOR_MAX = 120  # an ISO time with zone and a UUID (or a text id) fit; longer is not a cursor
TEXT_ID_MAX = 64


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[Any]
    older: str = ""  # the link to the next rows in the list's order, "" on the last page
    newer: str = ""  # the link to the previous rows, "" on the first page
    newest: str = ""  # the link to the first page, "" on the first page


def _text_id(key: str) -> str | None:
    """A text primary key as the console's links carry it: 1-64 ASCII letters, digits, '-' or '_'."""
    return (
        key
        if 0 < len(key) <= TEXT_ID_MAX and key.isascii() and key.replace("-", "").replace("_", "").isalnum()
        else None
    )


def cursor(
    request: HttpRequest, name: str = "before", *, integer_id: bool = False, text_id: bool = False
) -> tuple[datetime, Any] | None:
    """The `<ISO time>~<id>` in `?<name>=`, or None (the first page) for anything else. The id is a
    UUID unless the list's primary key is an integer (`integer_id`) or text (`text_id`)."""
    raw = request.GET.get(name, "")
    if not raw or len(raw) > CURSOR_MAX:
        return None
    moment, _, key = raw.rpartition("~")
    try:
        when = datetime.fromisoformat(moment)
        if integer_id:
            ident: Any = ascii_int(key, max_digits=18)
        else:
            ident = _text_id(key) if text_id else uuid.UUID(key)
    except ValueError:
        return None
    if ident is None or when.tzinfo is None:
        return None
    return when.astimezone(UTC), ident


def link(query: dict[str, str], name: str, when: datetime, ident: Any) -> str:
    """A page link keeping the list's non-empty filters."""
    return "?" + urlencode({**{k: v for k, v in query.items() if v}, name: f"{when.isoformat()}~{ident}"})


def first(query: dict[str, str]) -> str:
    return "?" + urlencode({k: v for k, v in query.items() if v})


def links(
    request: HttpRequest, query: dict[str, str], found: list[Any], time_of: Any, size: int = PAGE_SIZE
) -> Page:
    """The page of a selector asked for `size + 1` rows after the `before` cursor: its rows and links."""
    shown = found[:size]
    older = link(query, "before", time_of(shown[-1]), shown[-1].pk) if len(found) > size else ""
    paged = bool(request.GET.get("before") or request.GET.get("after"))
    return Page(shown, older=older, newest=first(query) if paged else "")


def keyset(
    request: HttpRequest,
    rows: QuerySet[Any],
    time_field: str,
    query: dict[str, str],
    *,
    size: int = PAGE_SIZE,
    text_id: bool = False,
    integer_id: bool = False,
    name: str = "",
    ascending: bool = False,
) -> Page:
    """One page of `rows` ordered by (`time_field`, pk), the latest first (the oldest with
    `ascending`), after the `<name>before` cursor (Next) or just before the `<name>after` cursor
    (Previous); rows with no time are left out."""
    rows = rows.filter(**{f"{time_field}__isnull": False})
    ahead = cursor(request, f"{name}before", text_id=text_id, integer_id=integer_id)
    behind = None if ahead else cursor(request, f"{name}after", text_id=text_id, integer_id=integer_id)
    onward, back = ("gt", "lt") if ascending else ("lt", "gt")
    order = [time_field, "pk"]
    reverse = [f"-{time_field}", "-pk"]
    if not ascending:
        order, reverse = reverse, order
    if behind is not None:  # the rows just before the cursor, read backwards, shown in order
        got = list(rows.filter(_past(time_field, back, *behind)).order_by(*reverse)[: size + 1])
        shown = list(reversed(got[:size]))
        has_newer, has_older = len(got) > size, True
    else:
        ordered = rows.order_by(*order)
        if ahead is not None:
            ordered = ordered.filter(_past(time_field, onward, *ahead))
        got = list(ordered[: size + 1])
        shown = got[:size]
        has_newer, has_older = ahead is not None, len(got) > size
    if not shown:
        return Page([], newest=first(query) if ahead or behind else "")
    top, bottom = shown[0], shown[-1]
    return Page(
        shown,
        older=link(query, f"{name}before", _time(bottom, time_field), bottom.pk) if has_older else "",
        newer=link(query, f"{name}after", _time(top, time_field), top.pk) if has_newer else "",
        newest=first(query) if has_newer else "",
    )


def _past(time_field: str, op: str, when: datetime, ident: Any) -> Q:
    return Q(**{f"{time_field}__{op}": when}) | Q(**{time_field: when, f"pk__{op}": ident})


def _time(row: Model, time_field: str) -> datetime:
    value = getattr(row, time_field)
    assert isinstance(value, datetime)
    return value
