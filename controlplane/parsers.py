"""Request body parsers for every DRF view (ingest reads its own body: `audit.api.read_json_body`)."""

from __future__ import annotations

import json
from typing import IO, Any

from django.conf import settings
from rest_framework import exceptions, parsers


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def check_storable(value: Any) -> None:
    """Every string (keys too) must be encodable as UTF-8: a lone surrogate (`"\\ud800"`) is valid
    JSON text but no database column, log or answer can hold it. Iterative: depth costs no stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise exceptions.ParseError(
                    "JSON parse error - a string holds a lone surrogate, which UTF-8 cannot encode"
                ) from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def strict_loads(text: str) -> Any:
    """JSON as every API body is read: NaN, Infinity and a key named twice are ValueError (and a
    body nested too deeply RecursionError; a lone surrogate passes here: see `JSONParser`)."""
    return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_object)


class JSONParser(parsers.JSONParser):
    """Strict JSON for every API body: NaN and Infinity, a key named twice in one object and a lone
    surrogate are 400 `malformed_json` (each would be stored or answered ambiguously, or not at
    all), and a body nested deeper than the interpreter's recursion limit (ten thousand `[`) is a
    400 too, not a RecursionError and a 500."""

    def parse(self, stream: IO[Any], media_type: str | None = None, parser_context: Any = None) -> Any:
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = stream.read().decode(encoding)
            data = strict_loads(text)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
        check_storable(data)
        return data
