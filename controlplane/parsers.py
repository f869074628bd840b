"""Request body parsers for every DRF view (ingest reads its own body: `audit.api.read_json_body`)."""

from __future__ import annotations

from typing import IO, Any

from rest_framework import exceptions, parsers


class JSONParser(parsers.JSONParser):
    """DRF's strict JSON parser (NaN and Infinity refused), plus: a body nested deeper than the
    interpreter's recursion limit (ten thousand `[`) is a 400 `malformed_json`, not a
    RecursionError and a 500."""

    def parse(self, stream: IO[Any], media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deeply") from None
