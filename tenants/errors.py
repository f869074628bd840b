"""One error shape for the whole API: `{"error": <code>, "detail": <sentence>, ...context}`.

Clients branch on `error` (stable, machine-readable); people read `detail`. Validation errors
also carry `fields`: {field name: [reasons]}."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler


class ApiError(exceptions.APIException):
    """A domain refusal with its status, code and any context (seq, index, field, ...)."""

    def __init__(self, status_code: int, code: str, detail: str, **context: Any) -> None:
        super().__init__(detail=detail, code=code)
        self.status_code = status_code
        self.code = code
        self.context = context


_DEFAULT_CODES = {
    status.HTTP_400_BAD_REQUEST: "invalid",
    status.HTTP_401_UNAUTHORIZED: "not_authenticated",
    status.HTTP_403_FORBIDDEN: "forbidden",
    status.HTTP_404_NOT_FOUND: "not_found",
    status.HTTP_405_METHOD_NOT_ALLOWED: "method_not_allowed",
    status.HTTP_413_REQUEST_ENTITY_TOO_LARGE: "too_large",
    status.HTTP_415_UNSUPPORTED_MEDIA_TYPE: "unsupported_media_type",
    status.HTTP_429_TOO_MANY_REQUESTS: "throttled",
}


def _code_of(exc: exceptions.APIException, status_code: int) -> str:
    codes = exc.get_codes()
    if isinstance(codes, str) and codes not in ("error", "invalid", "not_authenticated", "permission_denied"):
        return codes
    if isinstance(exc, exceptions.NotAuthenticated):
        return "not_authenticated"
    if isinstance(exc, exceptions.ParseError):
        return "malformed_json"
    return _DEFAULT_CODES.get(status_code, "error")


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, ApiError):
        response.data = {"error": exc.code, "detail": str(exc.detail), **exc.context}
        return response
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        first_field = next(iter(fields), None)
        reasons = fields.get(first_field) if first_field else None
        reason = reasons[0] if isinstance(reasons, list) and reasons else reasons
        response.data = {
            "error": "invalid",
            "detail": f"{first_field}: {reason}" if first_field else "invalid input",
            "field": first_field,
            "fields": fields,
        }
        return response
    if isinstance(exc, exceptions.APIException):
        response.data = {"error": _code_of(exc, response.status_code), "detail": str(exc.detail)}
    return response
