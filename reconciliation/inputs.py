"""Reconciliation's claim as a typed input (`core.inputs`): the API's body, the service's signature
and the OpenAPI schema. The fields are judged in the order the view judged them (worker, max,
wait, then the handlers), each refusal with its sentence as before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rest_framework import serializers

from core.errors import DomainError
from core.inputs import NUL, Input, Whole
from core.numbers import finite_number

MAX_CLAIM = 50
HANDLER_MAX = 200
MAX_HANDLERS = 200
NAME_MAX = 200


@dataclass(frozen=True)
class ClaimTerms:
    """Claim up to `max` due checks of `handlers` (each named once, in the order given) for
    `worker` (None: the claiming key's actor), waiting up to `wait` seconds for one."""

    handlers: tuple[str, ...]
    worker: str | None = None
    max: int = 10
    wait: float = 0


class _Worker(serializers.CharField):
    """The worker's name, at most NAME_MAX characters; null or missing is the claiming actor."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty or data is None:
            return None
        if not isinstance(data, str) or len(data) > NAME_MAX or NUL in data:
            raise DomainError("invalid", f"worker: a name of at most {NAME_MAX} characters", field="worker")
        return data


class _Wait(serializers.FloatField):
    """Seconds to wait for a due check, from 0 (the long-poll waits at most 25)."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty:
            raise serializers.SkipField
        if not finite_number(data) or data < 0:
            raise DomainError("invalid", "wait: seconds from 0 (at most 25 are waited)", field="wait")
        return data


class _Handlers(serializers.ListField):
    """A non-empty list of at most MAX_HANDLERS names of 1 to HANDLER_MAX characters, no NUL."""

    def __init__(self) -> None:
        super().__init__(child=serializers.CharField(max_length=HANDLER_MAX), max_length=MAX_HANDLERS)

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if isinstance(data, list) and any(isinstance(h, str) and NUL in h for h in data):
            raise DomainError("invalid", "handlers: names without NUL", field="handlers")
        if not isinstance(data, list) or not data:
            raise DomainError("invalid", "handlers: a non-empty list of handler names", field="handlers")
        if len(data) > MAX_HANDLERS:
            raise DomainError("invalid", f"handlers: at most {MAX_HANDLERS} names", field="handlers")
        if not all(isinstance(h, str) and 0 < len(h) <= HANDLER_MAX for h in data):
            raise DomainError(
                "invalid", f"handlers: each a name of 1 to {HANDLER_MAX} characters", field="handlers"
            )
        return tuple(dict.fromkeys(data))


class ReconciliationClaim(Input[ClaimTerms]):
    """`{"handlers": [...], "worker"?, "max"? (1-50, default 10), "wait"? (seconds)}`."""

    command = ClaimTerms

    worker = _Worker(required=False, allow_null=True, max_length=NAME_MAX)
    max = Whole(
        code="invalid",
        message=f"max: an integer from 1 to {MAX_CLAIM}",
        min_value=1,
        max_value=MAX_CLAIM,
        required=False,
    )
    wait = _Wait(required=False, min_value=0)
    handlers = _Handlers()
