"""An approval policy's terms as a typed input (`core.inputs`): the API's create and change, the
dashboard's form, the service's signature and the OpenAPI schema. The input checks each field on
its own; what depends on another field or on the tenant (`warn_before_s` within `ttl_s`, the
escalation's levels, named members, someone able to approve) is the service's, after the change is
laid over the policy's current terms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rest_framework import serializers

from approvals import predicates
from core.errors import DomainError
from core.inputs import NUL, Choice, Flag, Input, Strings, Text, Whole
from tenants.models import Role

NAME_MAX = 100
MAX_TTL_S = 30 * 24 * 3600
MAX_WINDOW_S = 7 * 24 * 3600
MAX_APPROVALS = 20
NOTE_MAX = 1000
CHOICES = ("approve", "deny")
SEMANTICS = ("PREVIEW", "REVERSIBLE", "COMPENSABLE", "IRREVERSIBLE")
FIELDS = (
    "name",
    "tool",
    "semantics",
    "predicates",
    "required_approvals",
    "eligible_roles",
    "eligible_members",
    "passkey_only",
    "ttl_s",
    "execution_window_s",
    "warn_before_s",
    "escalation",
    "enabled",
)


@dataclass(frozen=True)
class PolicyTerms:
    """The terms given; None is a term not given (a creation takes its default, a change keeps the
    current one)."""

    name: str | None = None
    tool: str | None = None
    semantics: tuple[str, ...] | None = None
    predicates: list[dict[str, Any]] | None = None
    required_approvals: int | None = None
    eligible_roles: tuple[str, ...] | None = None
    eligible_members: list[Any] | None = None
    passkey_only: bool | None = None
    ttl_s: int | None = None
    execution_window_s: int | None = None
    warn_before_s: int | None = None
    escalation: list[Any] | None = None
    enabled: bool | None = None

    def given(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS if getattr(self, name) is not None}


def _whole(name: str, low: int, high: int) -> Whole:
    return Whole(
        code="invalid",
        message=f"{name}: a whole number from {low} to {high}",
        min_value=low,
        max_value=high,
        required=False,
    )


def _flag(name: str) -> Flag:
    return Flag(code="invalid", message=f"{name}: true or false", required=False)


class _Predicates(serializers.ListField):
    """The predicate language (approvals.predicates), checked and normalised."""

    def __init__(self) -> None:
        super().__init__(child=serializers.DictField(), required=False)

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty:
            raise serializers.SkipField
        try:
            return predicates.validate(data)
        except predicates.InvalidPredicate as exc:
            raise DomainError("invalid_predicate", str(exc), field="predicates") from None


class _Listed(serializers.ListField):
    """A list, its items the service's to check (named members, escalation levels need the
    tenant's members and the policy's TTL)."""

    def __init__(self, child: serializers.Field, max_length: int, message: str) -> None:
        super().__init__(child=child, required=False, max_length=max_length)
        self.message = message

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty:
            raise serializers.SkipField
        if not isinstance(data, list) or len(data) > (self.max_length or 0):
            raise DomainError("invalid", self.message, field=self.field_name)
        return data


class PolicyChange(Input[PolicyTerms]):
    """A change of an approval policy: any of its terms; a key that is not a term is refused by
    name (never taken as a keyword of the service's own, such as `actor`)."""

    command = PolicyTerms

    name = Text(
        code="invalid_name",
        message=f"name: 1 to {NAME_MAX} characters",
        max_length=NAME_MAX,
        stripped=True,
        required=False,
    )
    tool = Text(
        code="invalid_tool", message="tool: a glob of 1 to 200 characters", max_length=200, required=False
    )
    semantics = Strings(
        code="invalid",
        message=f"semantics: a list of {', '.join(SEMANTICS)}",
        valid=lambda values: all(s in SEMANTICS for s in values),
        required=False,
    )
    predicates = _Predicates()
    required_approvals = _whole("required_approvals", 1, MAX_APPROVALS)
    eligible_roles = Strings(
        code="invalid",
        message=f"eligible_roles: a list of roles ({', '.join(Role.values)})",
        valid=lambda values: all(r in Role.values for r in values),
        required=False,
    )
    eligible_members = _Listed(
        serializers.CharField(), 100, "eligible_members: a list of at most 100 members"
    )
    passkey_only = _flag("passkey_only")
    ttl_s = _whole("ttl_s", 10, MAX_TTL_S)
    execution_window_s = _whole("execution_window_s", 1, MAX_WINDOW_S)
    warn_before_s = _whole("warn_before_s", 0, MAX_TTL_S)
    escalation = _Listed(serializers.DictField(), 5, "escalation: a list of at most 5 levels")
    enabled = _flag("enabled")

    def to_internal_value(self, data: Any) -> Any:
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise DomainError("invalid", f"{unknown[0][:100]}: not a policy field", field=unknown[0][:100])
        return super().to_internal_value(data)


class PolicyCreate(PolicyChange):
    """A new approval policy: its `name`, and any other term (the others take their defaults)."""

    name = Text(
        code="invalid_name", message=f"name: 1 to {NAME_MAX} characters", max_length=NAME_MAX, stripped=True
    )


# ---------------------------------------------------------------------------------------- votes


@dataclass(frozen=True)
class Glass:
    """Whether a vote breaks glass (owners only, with a written reason)."""

    break_glass: bool = False


@dataclass(frozen=True)
class VoteTerms:
    """A member's vote: approve or deny, a note (none: ""), and whether it breaks glass."""

    choice: str
    note: str = ""
    break_glass: bool = False


def _break_glass() -> Flag:
    return Flag(code="invalid", message="break_glass: true or false", required=False)


class _Note(serializers.CharField):
    """A string of at most NOTE_MAX characters without NUL; null or missing is no note."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty or data is None:
            return ""
        if not isinstance(data, str) or len(data) > NOTE_MAX or NUL in data:
            raise DomainError("invalid", f"note: a string of at most {NOTE_MAX} characters", field="note")
        return data


class VoteGlass(Input[Glass]):
    """What of a vote's body is judged before its request is found (its 404 comes after these):
    the body is an object and `break_glass`, if given, a boolean. The rest is `ApprovalVote`'s."""

    command = Glass

    break_glass = _break_glass()


class ApprovalVote(Input[VoteTerms]):
    """`{"choice": "approve" | "deny", "note"?, "break_glass"?}`, parsed once the request is found
    (`VoteGlass` judged break_glass before): choice, then note; a missing choice is refused like a
    wrong one. That break-glass needs an approval and a written reason is `vote`'s, after these."""

    command = VoteTerms
    MISSING_IS_WRONG = True

    break_glass = _break_glass()
    choice = Choice(CHOICES, code="invalid", message="choice: approve or deny")
    note = _Note(required=False, allow_null=True, max_length=NOTE_MAX)


@dataclass(frozen=True)
class ChallengeTerms:
    """Whether the passkey challenge is for a break-glass vote."""

    break_glass: bool = False


class _OnlyTrue(serializers.BooleanField):
    """`true` is true; anything else (missing, null, 1, "true", a form's field) is false and never
    refused: the challenge read it so before it was typed, and a client may rely on that."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        return data is True


class VoteChallengeAsk(Input[ChallengeTerms]):
    """`{"break_glass"?: true}`, read leniently: only `true` asks for a break-glass challenge, and
    a body that is not an object (or none) is an ordinary request, as it was before it was typed."""

    command = ChallengeTerms

    break_glass = _OnlyTrue(required=False)

    @classmethod
    def parse(cls, data: object) -> ChallengeTerms:
        return super().parse(data if isinstance(data, dict) else {})
