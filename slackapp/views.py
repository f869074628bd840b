"""Slack's requests: `/slack/interactions` (button clicks), `/slack/commands` (slash commands),
`/slack/events` (Events API). Each is authenticated by Slack's signature alone
(`tenants.access.SLACK_WEBHOOK`): the body is read (bounded), the signature checked over it
within five minutes and remembered (a replay is refused), and only then is the body parsed.

Slack wants an answer within 3 seconds: the view answers at once and queues the work (a Celery
task in `slackapp.tasks`), which decides and answers in Slack (ephemeral messages, the response
URL, message updates). A refusal is a 401 (or 400) in the JSON error shape, and nothing is queued.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import parse_qs

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from kombu.exceptions import OperationalError

from core.errors import DomainError
from slackapp import selectors, services, tasks
from slackapp.blocks import obj
from tenants.access import SLACK_WEBHOOK, AccessMap, allowed_methods, rule_for
from tenants.permissions import read_body_first

log = logging.getLogger(__name__)

ACCESS: AccessMap = {"POST": SLACK_WEBHOOK}


def _error(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"error": code, "detail": detail}, status=status)


def _form(body: bytes) -> dict[str, str]:
    """A url-encoded form as Slack sends it: one value per field (the first)."""
    try:
        fields = parse_qs(
            body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=100
        )
    except ValueError:
        raise DomainError("malformed_body", "the form could not be parsed") from None
    return {name: values[0] for name, values in fields.items()}


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise DomainError("malformed_json", "the body is not JSON") from None
    if not isinstance(value, dict):
        raise DomainError("malformed_json", "the body is not a JSON object")
    return value


def _queue(task: Any, *args: Any) -> None:
    """Hand the work to Celery; a broker that does not take it is a 503 (Slack retries the
    request, signed afresh), never a 500 and never work done here past Slack's 3 seconds."""
    try:
        task.delay(*args)
    except (OperationalError, OSError):
        log.warning("slack: could not queue %s", getattr(task, "name", task), exc_info=True)
        raise DomainError("queue_unavailable", "the work queue is unavailable; retry", status=503) from None


def _text(value: Any, limit: int = 64) -> str:
    return value if isinstance(value, str) and len(value) <= limit else ""


def signed(handler: Any) -> Any:
    """Method, body, signature and replay checks before `handler(request, body)` runs."""

    @csrf_exempt
    def view(request: HttpRequest) -> HttpResponse:
        if rule_for(ACCESS, request.method or "") is None:
            response = _error(405, "method_not_allowed", f"method {request.method} is not allowed")
            response["Allow"] = ", ".join(allowed_methods(ACCESS))
            return response
        try:
            read_body_first(request)
            services.verify_request(request.body, request.headers)
            return handler(request, request.body)
        except DomainError as exc:
            return JsonResponse({"error": exc.error, "detail": exc.detail}, status=exc.status)

    view.access = ACCESS  # type: ignore[attr-defined]  # read by the access table test
    return view


@signed
def interactions(request: HttpRequest, body: bytes) -> HttpResponse:
    payload = _json(_form(body).get("payload", ""))
    team = _text(obj(payload.get("team")).get("id"))
    tenant = selectors.tenant_of_team(team)
    if tenant is None:
        return HttpResponse(status=200)  # a workspace no tenant has: nothing to do, nothing to say
    _queue(tasks.handle_interaction, tenant.pk, payload)
    return HttpResponse(status=200)


@signed
def commands(request: HttpRequest, body: bytes) -> HttpResponse:
    form = _form(body)
    tenant = selectors.tenant_of_team(_text(form.get("team_id")))
    if tenant is None:
        return JsonResponse(
            {"response_type": "ephemeral", "text": "This Slack workspace is not connected to Sagaplane."}
        )
    _queue(tasks.handle_command, tenant.pk, form)
    return JsonResponse({"response_type": "ephemeral", "text": f"Working on `{_text(form.get('command'))}`…"})


@signed
def events(request: HttpRequest, body: bytes) -> HttpResponse:
    payload = _json(body.decode("utf-8"))
    kind = payload.get("type")
    if kind == "url_verification":
        return JsonResponse({"challenge": _text(payload.get("challenge"), 200)})
    if kind != "event_callback":
        return HttpResponse(status=200)
    event = obj(payload.get("event"))
    team = _text(payload.get("team_id"))
    if event.get("type") in ("app_uninstalled", "tokens_revoked") and team:
        _queue(tasks.handle_event, team, event)
    return HttpResponse(status=200)
