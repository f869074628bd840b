"""Reconciliation's claim and its observers' answers as typed inputs (`core.inputs`): the API's
bodies, the services' signatures and the OpenAPI schema. The fields are judged in the order the
views judged them by hand, each refusal with its sentence and field as before (the claim: worker,
max, wait, then the handlers; an answer: reversed's presence, error, token, reversed, detail)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from rest_framework import serializers

from core.errors import DomainError
from core.inputs import NUL, Flag, Input, Whole, batch_item_id
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


# ------------------------------------------------------------------------------------- answers

MAX_ANSWERS = 500
TOKEN_SENTENCE = "token: the integer the claim returned"
REVERSED_SENTENCE = "reversed: true, false or null"
DETAIL_SENTENCE = "detail: a string"


@dataclass(frozen=True)
class Answer:
    """An observer's answer for the check it holds under `token`: `reversed` true (confirmed),
    false (drift) or None (unverifiable: it could not tell, or it failed: `error`)."""

    token: int
    reversed: bool | None
    detail: str = ""
    error: bool = False


@dataclass(frozen=True)
class CheckAnswer:
    """One answer of a batch: the check's id as given (answered back as such) and as read."""

    given_id: str
    check_id: uuid.UUID
    answer: Answer


def _is_token(value: Any) -> bool:
    return type(value) is int  # not a boolean, not 1.0


def _is_reversed(value: Any) -> bool:
    return value is True or value is False or value is None  # identity: 1 == True


class _Reversed(serializers.Field):
    """true, false or null (its presence is judged before every field: ReportAnswer)."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if not _is_reversed(data):
            raise DomainError("invalid", REVERSED_SENTENCE, field="reversed")
        return data


class _Detail(serializers.Field):
    """A string (kept as given: the service cleans and cuts it), or null or missing: none."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty or data is None:
            return ""
        if not isinstance(data, str):
            raise DomainError("invalid", DETAIL_SENTENCE, field="detail")
        return data


class ReportAnswer(Input[Answer]):
    """`{"token", "reversed": true | false | null, "detail"?, "error"?}`. `reversed` must be
    present (null is an answer), judged first; then error, token, reversed's value and detail,
    the order the view judged them in. The check's own refusals (404, 409) are the service's,
    after these."""

    command = Answer
    MISSING_IS_WRONG = True  # a missing token is refused like a wrong one, as it was

    error = Flag(code="invalid", message="error: true or false", required=False)
    token = Whole(code="invalid", message=TOKEN_SENTENCE)
    reversed = _Reversed(allow_null=True)
    detail = _Detail(required=False, allow_null=True)

    def to_internal_value(self, data: Any) -> Any:
        if "reversed" not in data:
            raise DomainError("invalid", "reversed: required (true, false or null)", field="reversed")
        return super().to_internal_value(data)


def _check_answer(i: int, item: Any) -> CheckAnswer:
    """Item `i` of a batch, judged as it was by hand: its fields named `answers[i].<field>`; the
    id's and error's sentences name the item, token's, reversed's and detail's do not. Unlike a
    single report, an empty detail of any type (0, false, [], {}) is no detail."""
    where = f"answers[{i}]"
    if not isinstance(item, dict) or "reversed" not in item:
        raise DomainError("invalid", f"{where}: an object with id, token and reversed", field=where)
    check_id = batch_item_id(item, where, "check")
    error = item.get("error", False)
    if type(error) is not bool:
        raise DomainError("invalid", f"{where}.error: true or false", field=f"{where}.error")
    token: Any = item.get("token")
    reversed_, detail = item["reversed"], item.get("detail") or ""
    if not _is_token(token):
        raise DomainError("invalid", TOKEN_SENTENCE, field=f"{where}.token")
    if not _is_reversed(reversed_):
        raise DomainError("invalid", REVERSED_SENTENCE, field=f"{where}.reversed")
    if not isinstance(detail, str):
        raise DomainError("invalid", DETAIL_SENTENCE, field=f"{where}.detail")
    return CheckAnswer(item["id"], check_id, Answer(token, reversed_, detail, error))


class _Answers(serializers.ListField):
    """1 to MAX_ANSWERS answers, each judged in turn (the first at fault refuses the batch)."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if not isinstance(data, list) or not 0 < len(data) <= MAX_ANSWERS:
            raise DomainError("invalid", f"answers: a list of 1 to {MAX_ANSWERS} answers", field="answers")
        return tuple(_check_answer(i, item) for i, item in enumerate(data))


@dataclass(frozen=True)
class Answers:
    answers: tuple[CheckAnswer, ...]


class ReconciliationAnswers(Input[Answers]):
    """`{"answers": [{"id", "token", "reversed", "detail"?, "error"?}]}` (1 to MAX_ANSWERS)."""

    command = Answers

    answers = _Answers(child=serializers.DictField(), max_length=MAX_ANSWERS)
