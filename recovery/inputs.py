"""Recovery's commands as typed inputs (`core.inputs`): the API's body, the service's signature and
the OpenAPI schema, for the commands whose every check is on a field of their own. (The job and
saga decisions judge their body after finding the job or saga, a 404 first: their checks stay in
the services.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from rest_framework import serializers

from core.errors import DomainError
from core.inputs import Input, Strings
from core.outbound import check_url

URL_MAX = 500
MAX_HANDLERS = 100
HANDLER_MAX = 200


@dataclass(frozen=True)
class NewWebhook:
    """Where compensations (of `handlers`, or all when empty) are delivered instead of to workers."""

    url: str
    handlers: tuple[str, ...] = ()


class _WebhookUrl(serializers.CharField):
    """An http(s) URL of at most URL_MAX characters that the outbound-address guard lets through."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        wrong = DomainError("invalid", f"url: an http(s) URL of at most {URL_MAX} characters", field="url")
        if not isinstance(data, str) or len(data) > URL_MAX:
            raise wrong
        try:
            URLValidator(schemes=["http", "https"])(data)
        except ValidationError:
            raise wrong from None
        unsafe = check_url(data)
        if unsafe:
            raise DomainError("unsafe_url", f"url: {unsafe}", field="url")
        return data


class WebhookSet(Input[NewWebhook]):
    """`{"url", "handlers"?}`: a missing or null `handlers` is every handler."""

    command = NewWebhook
    MISSING_IS_WRONG = True  # a missing url is refused like a wrong one

    url = _WebhookUrl(max_length=URL_MAX)
    handlers = Strings(
        code="invalid",
        message=f"handlers: a list of up to {MAX_HANDLERS} handler names",
        valid=lambda names: all(0 < len(h) <= HANDLER_MAX for h in names),
        max_length=MAX_HANDLERS,
        allow_null=True,
        required=False,
    )
