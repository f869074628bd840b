"""OpenAPI: every operation documents the error answers it can give, in the one error shape.

A drf-spectacular postprocessing hook (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]) adds the
shared `Error` component to every operation, so a new view gets it without a line of its own:
- every operation: 400 (any parameter can be malformed, and a NUL in any path or query string is
  refused), 401 (no or a bad credential), 403 (the key's scope or the member's role does not
  allow it), 404 (no tenant for this person, or no such object);
- with a request body: 413 (over the size limit) and 415 (not JSON).
A view's own declaration for a status (e.g. ingest's 422 `ChainBroken`) is kept as it is."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

ERROR_COMPONENT = "Error"
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every non-2xx answer of the API. Clients branch on `error`; people read "
    "`detail`. Refusals about one input name it in `field`; validation errors list every field "
    "at fault in `fields` (dotted paths for nested fields and list items). Some refusals add "
    "context (`seq`, `index`, `reason`, `limit`, ...).",
    "properties": {
        "error": {"type": "string", "description": "machine-readable code, e.g. invalid, not_found"},
        "detail": {"type": "string", "description": "what went wrong, in a sentence"},
        "field": {"type": "string", "nullable": True},
        "fields": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
    },
    "required": ["error", "detail"],
    "additionalProperties": True,
}


class ErrorSerializer(serializers.Serializer):
    """The `Error` component, for a view declaring a status of its own (e.g. 409 `not_sealed`):
    `extend_schema(responses={409: ErrorSerializer})`. The hook replaces the component with
    ERROR_SCHEMA, which says the same and more."""

    error = serializers.CharField()
    detail = serializers.CharField()
    field = serializers.CharField(required=False, allow_null=True)


ALWAYS = {
    "400": "The request is malformed: a parameter or body field is invalid (named in `field`).",
    "401": "No credential, or one that is unknown, revoked or expired.",
    "403": "The API key lacks the scope, or the member's role the capability, this needs.",
    "404": "No such tenant for these credentials, or no such object in it.",
}
WITH_BODY = {
    "413": "The body is larger than the server accepts.",
    "415": "The body is not in a supported media type (JSON).",
}
METHODS = ("get", "put", "post", "patch", "delete", "head", "options", "trace")


def _error_response(description: str) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
    return {"description": description, "content": {"application/json": {"schema": ref}}}


def add_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    result.setdefault("components", {}).setdefault("schemas", {})[ERROR_COMPONENT] = ERROR_SCHEMA
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if method not in METHODS:
                continue
            responses = operation.setdefault("responses", {})
            wanted = {**ALWAYS, **(WITH_BODY if "requestBody" in operation else {})}
            for status, description in wanted.items():
                responses.setdefault(status, _error_response(description))
    return result
