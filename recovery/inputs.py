"""Recovery's commands as typed inputs (`core.inputs`): the API's body, the service's signature and
the OpenAPI schema (the webhook, a human's resolution of a job, "rollback to here"). The views judge
a decision's body once the path's job or saga is found (another tenant's id is a 404 whatever the
body says). Retrying a job takes no body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from rest_framework import serializers

from core.errors import DomainError
from core.inputs import Input, Strings, Text, Whole
from core.outbound import check_url

URL_MAX = 500
MAX_HANDLERS = 100
HANDLER_MAX = 200
NOTE_MAX = 2000  # recovery.actions.common.TEXT_MAX
STEP_MAX = 10**8 - 1  # the dashboard's form takes up to 8 digits


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


@dataclass(frozen=True)
class Resolution:
    """A human dealt with an escalated or pending step: `note` says how (recorded)."""

    note: str


class ResolveJob(Input[Resolution]):
    """`{"note"}`: 1 to 2000 characters, not only blanks."""

    command = Resolution
    MISSING_IS_WRONG = True

    note = Text(
        code="invalid",
        message=f"note: a non-empty string of at most {NOTE_MAX} characters",
        max_length=NOTE_MAX,
        stripped=True,
    )


@dataclass(frozen=True)
class RollbackTo:
    """Compensate every step after ordinal `to_step` (0: every step), newest first."""

    to_step: int


class RollbackSaga(Input[RollbackTo]):
    """`{"to_step": N}`: a whole step number from 0."""

    command = RollbackTo
    MISSING_IS_WRONG = True

    to_step = Whole(code="invalid", message="to_step: a step number from 0", min_value=0, max_value=STEP_MAX)
