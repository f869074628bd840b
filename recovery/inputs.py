"""Recovery's commands as typed inputs (`core.inputs`): the API's body, the service's signature and
the OpenAPI schema (the webhook, a human's resolution or assignment of a job, "rollback to here",
and a worker's completion, failure and heartbeat of the job it holds). The views judge a decision's
body once the path's job or saga is found (another tenant's id is a 404 whatever the body says); a
worker's report is judged before its job is looked up, as it always was (recovery.api._judged).
Retrying a job takes no body."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from rest_framework import serializers

from core.errors import DomainError
from core.inputs import NUL, Flag, Input, Strings, Text, Whole, batch_item_id
from core.longpoll import MAX_WAIT_S
from core.numbers import finite_number
from core.outbound import check_url
from recovery.actions.common import DEFAULT_JOB_LEASE_S, MAX_JOB_LEASE_S, TEXT_MAX
from recovery.models import Escalation

URL_MAX = 500
MAX_HANDLERS = 100
HANDLER_MAX = 200
NOTE_MAX = TEXT_MAX
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


ASSIGNEE_MAX = 200
TOKEN = "token: the integer the claim returned"


def _token() -> Whole:
    """The job's fencing token the claim returned (a JSON integer; the service compares it)."""
    return Whole(code="invalid", message=TOKEN)


def _refused(field: serializers.Field, message: str) -> DomainError:
    return DomainError("invalid", message, field=field.field_name)


@dataclass(frozen=True)
class Completion:
    """The compensation ran; `token` is the holder's."""

    token: int


class CompleteJob(Input[Completion]):
    """`{"token"}`."""

    command = Completion
    MISSING_IS_WRONG = True  # a missing token is refused like a wrong one

    token = _token()


class _ErrorText(serializers.CharField):
    """Free text of at most TEXT_MAX characters without NUL; missing or null is ""."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty or data is None:
            return ""
        if not isinstance(data, str) or len(data) > TEXT_MAX or "\x00" in data:
            raise _refused(self, f"{self.field_name}: a string of at most {TEXT_MAX} characters")
        return data


class _Reason(serializers.CharField):
    """Why the failure escalates at once: omitted (or null), or "no_handler"."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty or data is None:
            return None
        if data != Escalation.NO_HANDLER.value:
            raise _refused(self, "reason: omit it, or 'no_handler'")
        return data


@dataclass(frozen=True)
class Failure:
    """The compensation raised `error`: retried after a backoff while attempts remain and
    `retryable`, else escalated; `reason="no_handler"` (the worker cannot run it) escalates at once."""

    token: int
    error: str = ""
    retryable: bool = True
    reason: str | None = None


class FailJob(Input[Failure]):
    """`{"token", "error"?, "retryable"? (true), "reason"?}`, judged in the order the service
    judged them: error, retryable, reason, then the token."""

    command = Failure
    MISSING_IS_WRONG = True

    error = _ErrorText(required=False, allow_null=True, max_length=TEXT_MAX)
    retryable = Flag(code="invalid", message="retryable: true or false", required=False)
    reason = _Reason(required=False, allow_null=True)
    token = _token()


class _LeaseSeconds(serializers.FloatField):
    """Seconds from 1 to MAX_JOB_LEASE_S, a JSON number (not a boolean); missing or null is
    DEFAULT_JOB_LEASE_S."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty or data is None:
            return DEFAULT_JOB_LEASE_S
        if not finite_number(data) or not 1 <= data <= MAX_JOB_LEASE_S:
            raise _refused(self, f"lease_s: seconds from 1 to {MAX_JOB_LEASE_S:g}")
        return float(data)


@dataclass(frozen=True)
class LeaseExtension:
    """Still working on it: the holder's lease runs `lease_s` seconds from now."""

    token: int
    lease_s: float = DEFAULT_JOB_LEASE_S


class HeartbeatJob(Input[LeaseExtension]):
    """`{"token", "lease_s"? (1-300, default 30)}`: lease_s judged first, as the service did."""

    command = LeaseExtension
    MISSING_IS_WRONG = True

    lease_s = _LeaseSeconds(required=False, allow_null=True, min_value=1, max_value=MAX_JOB_LEASE_S)
    token = _token()


class _Assignee(serializers.CharField):
    """A username of at most ASSIGNEE_MAX characters, or "" (blanks only too) for nobody; kept
    without its surrounding blanks. Whether it names a member is the service's (after the job's
    state), so any other text is that refusal, as before."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if not isinstance(data, str) or len(data) > ASSIGNEE_MAX:
            raise _refused(self, 'assignee: a member\'s username, or "" for nobody')
        return data.strip()


@dataclass(frozen=True)
class Assignment:
    """Who takes up an escalated job (a member's username), "" for nobody."""

    assignee: str


class AssignJob(Input[Assignment]):
    """`{"assignee"}`."""

    command = Assignment

    assignee = _Assignee(allow_blank=True, max_length=ASSIGNEE_MAX)


# ---------------------------------------------------------------------- a worker's claim and results

MAX_CLAIM_HANDLERS = 500
WORKER_MAX = 200
MAX_CLAIM_BATCH = 100
MAX_RESULTS = 500


class _ClaimHandlers(serializers.ListField):
    """1 to MAX_CLAIM_HANDLERS names of 1 to HANDLER_MAX characters, no NUL; missing is wrong."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if (
            not isinstance(data, list)
            or not 0 < len(data) <= MAX_CLAIM_HANDLERS
            or not all(isinstance(h, str) and 0 < len(h) <= HANDLER_MAX and NUL not in h for h in data)
        ):
            raise _refused(self, f"handlers: a list of 1 to {MAX_CLAIM_HANDLERS} handler names")
        return tuple(data)


class _Worker(serializers.CharField):
    """The worker's name, at most WORKER_MAX characters; null, missing or "" is the claiming key's."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty or data is None:
            return ""
        if not isinstance(data, str) or len(data) > WORKER_MAX or NUL in data:
            raise _refused(self, f"worker: a name of at most {WORKER_MAX} characters")
        return data


class _BatchSize(serializers.IntegerField):
    """How many jobs to take, 1 to MAX_CLAIM_BATCH; null is 1. Given at all, the answer is a batch
    (`"jobs"`); missing (None) it is the one `"job"`."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty:
            raise serializers.SkipField
        if data is None:
            return 1
        if type(data) is not int or not 1 <= data <= MAX_CLAIM_BATCH:
            raise _refused(self, f"max_jobs: an integer from 1 to {MAX_CLAIM_BATCH}")
        return data


class _LongPollWait(serializers.FloatField):
    """Seconds to wait for a job (0 to 25). The long-poll reads it from the body itself
    (`core.longpoll.body_wait`: anything it cannot read is no wait), so it is never refused."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        raise serializers.SkipField


@dataclass(frozen=True)
class JobResult:
    """One result of a batch for the job the worker holds under `token`: its id as given (answered
    back as such) and as read; a completion, or the compensation's `failure`."""

    given_id: str
    job_id: uuid.UUID
    token: int
    failure: Failure | None = None


def _job_result(i: int, item: Any) -> JobResult:
    """Item `i` of a batch, its fields named `results[i].<field>`: its shape, id and token, then
    a failure's fields as `FailJob` judges them. A completion's other fields are not judged."""
    where = f"results[{i}]"
    if not isinstance(item, dict) or type(item.get("ok")) is not bool:
        raise DomainError("invalid", f"{where}: an object with id, token and ok", field=where)
    job_id = batch_item_id(item, where, "job")
    token = item.get("token")
    if type(token) is not int:
        raise DomainError("invalid", f"{where}.{TOKEN}", field=f"{where}.token")
    if item["ok"]:
        return JobResult(item["id"], job_id, token)
    try:
        failure = FailJob.parse(item)  # a single failure's fields and sentences, named in the item
    except DomainError as refused:
        field = f"{where}.{refused.field}"
        raise DomainError(refused.code, f"{where}.{refused.detail}", field=field) from None
    return JobResult(item["id"], job_id, token, failure)


class _Results(serializers.ListField):
    """1 to MAX_RESULTS results, each judged in turn (the first at fault refuses the batch);
    missing is wrong where the field is required."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty and not self.required:
            raise serializers.SkipField
        if not isinstance(data, list) or not 0 < len(data) <= MAX_RESULTS:
            raise _refused(self, f"results: a list of 1 to {MAX_RESULTS} results")
        return tuple(_job_result(i, item) for i, item in enumerate(data))


def _results(*, required: bool) -> _Results:
    return _Results(child=serializers.DictField(), max_length=MAX_RESULTS, required=required)


@dataclass(frozen=True)
class Results:
    results: tuple[JobResult, ...]


class RecoveryResults(Input[Results]):
    """`{"results": [{"id", "token", "ok": true} | {"id", "token", "ok": false, "error"?,
    "retryable"? (true), "reason"?}]}` (1 to MAX_RESULTS)."""

    command = Results

    results = _results(required=True)


@dataclass(frozen=True)
class ClaimTerms:
    """Take up to `max_jobs` jobs of `handlers` for `worker` ("": the claiming key's actor), each
    leased for `lease_s` seconds; `max_jobs` None is one job, answered as `"job"` alone. `results`
    (None: none) are the worker's finished jobs, recorded before the claim."""

    handlers: tuple[str, ...]
    worker: str = ""
    lease_s: float = DEFAULT_JOB_LEASE_S
    max_jobs: int | None = None
    results: tuple[JobResult, ...] | None = None


class RecoveryClaim(Input[ClaimTerms]):
    """`{"handlers": [...], "worker"?, "lease_s"? (1-300, default 30), "max_jobs"? (1-100),
    "results"?, "wait"? (0-25 s)}`, judged in that order (the terms before any result)."""

    command = ClaimTerms

    handlers = _ClaimHandlers(
        child=serializers.CharField(max_length=HANDLER_MAX), max_length=MAX_CLAIM_HANDLERS
    )
    worker = _Worker(required=False, allow_null=True, allow_blank=True, max_length=WORKER_MAX)
    lease_s = _LeaseSeconds(required=False, allow_null=True, min_value=1, max_value=MAX_JOB_LEASE_S)
    max_jobs = _BatchSize(required=False, allow_null=True, min_value=1, max_value=MAX_CLAIM_BATCH)
    results = _results(required=False)
    wait = _LongPollWait(required=False, min_value=0, max_value=MAX_WAIT_S)
