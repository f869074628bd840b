"""One error shape for the whole API, and one place that produces it.

Every `/api/` and `/v1/` answer that is not 2xx is JSON `{"error": <code>, "detail": <sentence>,
...context}`: clients branch on `error` (stable, machine-readable); people read `detail`.

- Domain code raises `DomainError(code, detail, *, status, field, context)` (a subclass only where
  a caller catches that kind apart), which knows its HTTP status, code, sentence and extra fields;
  `api_exception_handler` (DRF's EXCEPTION_HANDLER) turns it into the response, the dashboard's
  form handlers show `detail` beside `field`, and the fast routes (tenants/fastroute.py) fall back to
  the full stack, which renders it the same way. Views never convert errors by hand.
- DRF's own exceptions get the same shape; validation errors also carry `field` (the first one at
  fault) and `fields` ({dotted field path: [reasons]}, nested serializers and list items
  flattened, so no Python repr ever reaches a client).
- `ErrorShapeMiddleware` covers what never reaches a DRF view: an unknown API route, an
  unhandled exception (500), Django's own refusals (a bad Host, a request too large). It also
  refuses input no view can use: a NUL character in the path or the query string (Postgres text
  cannot hold one) is a 400 before any view runs, JSON on API routes and a 400 page elsewhere
  (where a posted form's fields are checked too).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler

logger = logging.getLogger(__name__)

API_PREFIXES = ("/api/", "/v1/")
NUL = "\x00"


class DomainError(Exception):
    """A refusal the client can act on: a machine-readable `code` (the body's `error`), a sentence
    (`detail`), the HTTP `status` (400 unless said), the input at fault (`field`, in the body when
    given) and any further `context` of the body (`limit`, `retry_after`, an export's `status`).

    The one error class of the domain: code raises it with its own code rather than a class of its
    own. A subclass exists only where a caller must catch that kind apart from the others
    (`IngestRefused`, `PasskeyRefused`, `SlackError`, `IntegrationRefused`, `BundleUnavailable`,
    `availability.Unavailable`, `InvalidInvitation`); each takes this same signature (an ingest
    refusal also names the refused record, `seq` and `index`, which the ingest log keeps and a 409
    or 422 body carries). Any other exception class of the apps is internal, never answered
    (tests/controlplane/test_one_way.py)."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        status: int = 400,
        field: str | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.status = status
        self.field = field
        self.extra = dict(context or {})

    @property
    def error(self) -> str:
        """The body's `error` code."""
        return self.code

    def context(self) -> dict[str, Any]:
        """Fields of the body beside `error` and `detail`."""
        named = {"field": self.field} if self.field else {}
        return {**named, **self.extra}

    def body(self) -> dict[str, Any]:
        return {"error": self.error, "detail": self.detail, **self.context()}


def per_item(
    items: list[dict[str, Any]], outcomes: list[Any], answer: Callable[[Any], dict[str, Any]]
) -> list[dict[str, Any]]:
    """A batch route's answers, in the order of its items: `{"id", "error", "detail"}` for an
    item refused with a DomainError (the others were still recorded), else `answer(outcome)`."""
    return [
        {"id": item["id"], "error": outcome.error, "detail": outcome.detail}
        if isinstance(outcome, DomainError)
        else answer(outcome)
        for item, outcome in zip(items, outcomes, strict=True)
    ]


def is_api_path(path: str) -> bool:
    return path.startswith(API_PREFIXES)


# ------------------------------------------------------------------------------- DRF errors

_DEFAULT_CODES = {
    400: "invalid",
    401: "not_authenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    410: "gone",
    413: "too_large",
    415: "unsupported_media_type",
    429: "throttled",
    500: "server_error",
    503: "unavailable",
}
# DRF's generic codes say less than the status; a view's specific code (e.g. `missing_scope`) wins.
_GENERIC_CODES = frozenset({"error", "invalid", "not_authenticated", "permission_denied"})


def code_for_status(status: int) -> str:
    return _DEFAULT_CODES.get(status, "server_error" if status >= 500 else "error")


def _code_of(exc: exceptions.APIException, status: int) -> str:
    if isinstance(exc, exceptions.ParseError):
        return "malformed_json"
    codes = exc.get_codes()
    if isinstance(codes, str) and codes not in _GENERIC_CODES:
        return codes
    if isinstance(exc, exceptions.NotAuthenticated):
        return "not_authenticated"
    return code_for_status(status)


def flatten_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested validation detail as {dotted path: [reasons]}: `{"scopes": {0: [...]}}`
    becomes `{"scopes.0": [...]}`, a nested serializer's `{"a": {"b": [...]}}` `{"a.b": [...]}`."""
    if isinstance(detail, Mapping):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            out.update(flatten_errors(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(detail, list | tuple):
        if all(not isinstance(item, Mapping | list | tuple) for item in detail):
            return {prefix or "non_field_errors": [str(item) for item in detail]}
        out = {}
        for index, item in enumerate(detail):
            if item:  # a list of child serializers reports {} for each valid child
                out.update(flatten_errors(item, f"{prefix}.{index}" if prefix else str(index)))
        return out
    return {prefix or "non_field_errors": [str(detail)]}


def _validation_body(exc: exceptions.ValidationError) -> dict[str, Any]:
    fields = flatten_errors(exc.detail)
    first = next(iter(fields), None)
    if first is None:
        return {"error": "invalid", "detail": "invalid input", "field": None, "fields": {}}
    reasons = fields[first]
    return {
        "error": "invalid",
        "detail": f"{first}: {reasons[0]}" if reasons else f"{first}: invalid",
        "field": first,
        "fields": fields,
    }


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: a `DomainError` or any DRF/Django refusal as the one shape; a
    store out of reach (`core.availability.failed`) as a 503 refusal with Retry-After. Anything
    else is re-raised (None): the view's transaction rolls back and the middleware answers a JSON
    500."""
    if isinstance(exc, DomainError):
        return _refusal(exc)
    from core import availability

    if (unreachable := availability.refusal_for(exc)) is not None:  # marks the store down, probes it
        return _refusal(unreachable)
    # Django's own (get_object_or_404, PermissionDenied) as DRF's, so they get the shape below.
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or None)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = _validation_body(exc)
    elif isinstance(exc, exceptions.APIException):
        if isinstance(exc.detail, str):
            detail = str(exc.detail)
        else:
            detail = "; ".join(f"{path}: {' '.join(why)}" for path, why in flatten_errors(exc.detail).items())
        response.data = {"error": _code_of(exc, response.status_code), "detail": detail}
    return response


def _refusal(exc: DomainError) -> Response:
    response = Response(exc.body(), status=exc.status)
    if exc.status == 503:  # a store out of reach: worth asking again shortly
        response["Retry-After"] = "1"
    return response


# ----------------------------------------------------------------------- every other answer


def error_response(status: int, code: str, detail: str, **extra: Any) -> JsonResponse:
    return JsonResponse({"error": code, "detail": detail, **extra}, status=status)


_FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


def _nul_in(params: Any, where: str) -> str | None:
    for name, values in params.lists():
        if NUL in name:
            return where
        if any(isinstance(value, str) and NUL in value for value in values):
            return name
    return None


def _nul_in_request(request: HttpRequest) -> str | None:
    """Where a NUL character is in the request's path, query string or (on a page) posted form,
    or None. API bodies are the parsers' and serializers' to refuse (DRF's CharField does)."""
    if NUL in request.path_info:
        return "path"
    found = _nul_in(request.GET, "query")
    posted_form = request.method == "POST" and request.content_type in _FORMS
    if found is None and posted_form and not is_api_path(request.path_info):
        found = _nul_in(request.POST, "form")
    return found


def _is_json(response: HttpResponse) -> bool:
    return response.get("Content-Type", "").split(";")[0].strip() == "application/json"


class ErrorShapeMiddleware:
    """Refuses NUL in the path or query (400) before any view, and gives every non-2xx answer
    on an API route the JSON shape, whoever produced it (the URL resolver's 404, Django's 400 and
    500 pages, an exception no view handled)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        where = _nul_in_request(request)
        response = self._refuse_nul(request, where) if where is not None else self.get_response(request)
        if is_api_path(request.path_info) and response.status_code >= 400 and not _is_json(response):
            return self._as_json(response)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_api_path(request.path_info):
            return None  # Django's 500 page (and its error report)
        logger.error("unhandled error on %s %s", request.method, request.path, exc_info=exception)
        return error_response(500, "server_error", "an internal error occurred; it has been logged")

    @staticmethod
    def _refuse_nul(request: HttpRequest, where: str) -> HttpResponse:
        if where == "path":
            detail = "the path holds a NUL character"
        elif where in ("query", "form"):
            detail = f"a {where} field's name holds a NUL character"
        else:
            detail = f"{where}: holds a NUL character"
        if is_api_path(request.path_info):
            return error_response(400, "invalid", detail, field=where)
        return defaults.bad_request(request, ValueError(detail))

    @staticmethod
    def _as_json(response: HttpResponse) -> HttpResponse:
        status = response.status_code
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "error"
        shaped = error_response(status, code_for_status(status), phrase.lower())
        for header in ("Allow", "Retry-After", "WWW-Authenticate"):
            if header in response:
                shaped[header] = response[header]
        return shaped
