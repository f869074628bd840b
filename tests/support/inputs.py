"""Inputs a hostile client sends, shared by the tests that must refuse them with a 4xx."""

from __future__ import annotations


def _b64(text: str | bytes) -> str:
    import base64

    raw = text.encode() if isinstance(text, str) else text
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


HOSTILE_CURSORS = [
    _b64("0001-01-01T00:00:00+14:00|5"),  # UTC before year 1: no datetime holds it
    _b64("9999-12-31T23:59:59-14:00|5"),  # UTC after year 9999
    _b64("2026-01-01T00:00:00+00:00|0"),
    _b64("2026-01-01T00:00:00+00:00|-1"),
    _b64(f"2026-01-01T00:00:00+00:00|{2**63}"),
    _b64("2026-01-01T00:00:00+00:00|" + "9" * 5000),  # past int()'s digit limit
    _b64("2026-01-01T00:00:00+00:00|\u0663"),  # a non-ASCII digit
    _b64("2026-01-01T00:00:00+00:00|1\x00"),
    _b64("no separator"),
    _b64("|"),
    "Zm9v\u00e9YmFy",  # non-ASCII in the cursor itself
    "%00",
    "A" * 100_000,  # huge
]
