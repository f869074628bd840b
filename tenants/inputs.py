"""The tenant's commands as typed inputs (`core.inputs`): a new API key. The API view parses its
body with `ApiKeyCreate`, the administration page's form builds the same body, the service takes
the `NewApiKey`, and the OpenAPI schema documents the serializer.

Revoking a key takes no body (the key is named by the path)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rest_framework import serializers
from rest_framework.fields import empty

from core.errors import DomainError
from core.inputs import NUL, Input, Strings, Text
from tenants.models import Scope

NAME_MAX = 100
SCOPES_MESSAGE = f"scopes must be a non-empty subset of {', '.join(Scope.values)}"
EXPIRY_MESSAGE = "expires_at must be an ISO 8601 moment with its time zone, or null"
MOMENT_MAX = 64


@dataclass(frozen=True)
class NewApiKey:
    """A key named `name` for `scopes` (each named once), valid until `expires_at` (None: until
    revoked)."""

    name: str
    scopes: tuple[str, ...]
    expires_at: datetime | None = None


class _Moment(serializers.DateTimeField):
    """An ISO 8601 string with its time zone (not a number, not a naive moment), or null."""

    def run_validation(self, data: Any = empty) -> Any:
        if data is empty:
            raise serializers.SkipField
        if data is None:
            return None
        wrong = DomainError("invalid_expiry", EXPIRY_MESSAGE, field="expires_at")
        if not isinstance(data, str) or len(data) > MOMENT_MAX or NUL in data:
            raise wrong
        try:
            moment = datetime.fromisoformat(data.replace("Z", "+00:00"))
        except ValueError:
            raise wrong from None
        if moment.tzinfo is None:
            raise wrong
        return moment


class ApiKeyCreate(Input[NewApiKey]):
    """`{"name", "scopes": [...], "expires_at"?}`: the key itself is answered once."""

    command = NewApiKey

    name = Text(
        code="invalid_name",
        message=f"name must be 1 to {NAME_MAX} characters",
        max_length=NAME_MAX,
        stripped=True,
    )
    scopes = Strings(
        code="invalid_scope",
        message=SCOPES_MESSAGE,
        valid=lambda scopes: bool(scopes) and set(scopes) <= set(Scope.values),
        max_length=len(Scope.values) * 4,
    )
    expires_at = _Moment(required=False, allow_null=True)
