"""One typed input per command: declared once, used by the API view, the dashboard's form handler,
the service's signature and the OpenAPI schema.

A command's input is an `Input` (a DRF serializer whose fields are the strict ones below) and its
validated result a frozen dataclass (`Input.command`), which the service takes as its argument:
- the API view parses its JSON body with `BudgetCreate.parse(request.data)` and declares the same
  class as its `@extend_schema(request=...)`;
- a dashboard form handler turns what is presentation only (units, checkboxes, a scope typed in
  two inputs) into the same body and parses it with the same class;
- the service trusts its typed argument: what can be refused about one field is refused here.

The fields are strict, not DRF's coercing ones: `"5"` is not 5, `true` is not 1, a NUL character
is never text. A refusal is a `DomainError` naming the field with the command's own code and
sentence (`invalid_window`, "window_s must be a whole number from 1 to ..."), raised at the first
field at fault in declaration order, so the API answers it in the one error shape and the form
shows it beside its field. A required field that is missing is `invalid` with "<field>: required",
unless the input says a missing field is refused like a wrong one (`MISSING_IS_WRONG`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, ClassVar, Generic, NoReturn, TypeVar

from rest_framework import serializers
from rest_framework.fields import SkipField, empty

from core.errors import DomainError

C = TypeVar("C")
NUL = "\x00"


def json_object(data: object) -> dict[str, Any]:
    """A request's body (`request.data`) as the JSON object every command takes, else the 400
    naming the body."""
    if isinstance(data, dict):
        return data
    if isinstance(data, Mapping):
        return dict(data)
    raise DomainError("invalid", "the body must be a JSON object", field="body")


def batch_item_id(item: dict[str, Any], where: str, what: str) -> uuid.UUID:
    """A batch item's `id`: the UUID of the `what` (job, check) the claim returned, else the 400
    naming `<where>.id`."""
    try:
        found = uuid.UUID(item["id"]) if isinstance(item.get("id"), str) else None
    except ValueError:
        found = None
    if found is None:
        raise DomainError("invalid", f"{where}.id: a {what} id the claim returned", field=f"{where}.id")
    return found


class Input(serializers.Serializer, Generic[C]):
    """A command's input: its strict fields, and the dataclass its validated values make."""

    command: ClassVar[Callable[..., Any]]
    MISSING_IS_WRONG: ClassVar[bool] = False

    def to_command(self) -> C:
        made: C = type(self).command(**self.validated_data)
        return made

    @classmethod
    def parse(cls: type[Input[C]], data: object) -> C:
        """`data` (a JSON body, or what a form handler built) as the command, or a `DomainError`
        naming the first field at fault. Fields the input does not declare are ignored."""
        serializer = cls(data=json_object(data))
        serializer.is_valid(raise_exception=True)  # the fields raise DomainError themselves
        return serializer.to_command()

    @classmethod
    def parse_change(
        cls: type[Input[C]], current: Mapping[str, Any], data: object, *, fixed: Sequence[str] = ()
    ) -> C:
        """A partial change (a PATCH body) of what `current` holds (its values as this input takes
        them), as the whole command: the fields `data` names replace the current ones and the whole
        is checked as by `parse`. A field the input does not declare, or a `fixed` one given another
        value, is refused (naming it) rather than ignored: nothing would change it."""
        change = json_object(data)
        declared = cls().fields
        for name, value in change.items():
            if name not in declared:
                shown = name[:100]
                raise DomainError("unknown_field", f"{shown}: not a field of this resource", field=shown)
            if name in fixed and value != current.get(name):
                raise DomainError("immutable_field", f"{name}: cannot be changed", field=name)
        return cls.parse({**current, **change})


def _refuse(field: serializers.Field, code: str, message: str) -> NoReturn:
    raise DomainError(code, message, field=field.field_name)


def _given(field: serializers.Field, data: Any, code: str, message: str) -> Any:
    """`data` unless the field is missing: then SkipField (the dataclass' default applies) for an
    optional field, and a refusal for a required one."""
    if data is not empty:
        return data
    if not field.required:
        raise SkipField
    parent = field.parent
    if isinstance(parent, Input) and parent.MISSING_IS_WRONG:
        _refuse(field, code, message)
    _refuse(field, "invalid", f"{field.field_name}: required")


class Text(serializers.CharField):
    """A string of `min_length` to `max_length` characters, no NUL; `stripped` also refuses one
    of blanks only, and `valid` one it does not accept."""

    def __init__(
        self,
        *,
        code: str,
        message: str,
        stripped: bool = False,
        valid: Callable[[str], bool] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("min_length", 1)
        super().__init__(**kwargs)
        self.code, self.message, self.stripped, self.valid = code, message, stripped, valid

    def run_validation(self, data: Any = empty) -> Any:
        data = _given(self, data, self.code, self.message)
        if data is None and self.allow_null:
            return None
        if (
            not isinstance(data, str)
            or NUL in data
            or len(data) < (self.min_length or 0)
            or (self.max_length is not None and len(data) > self.max_length)
            or (self.stripped and not data.strip())
            or (self.valid is not None and not self.valid(data))
        ):
            _refuse(self, self.code, self.message)
        return data


class Whole(serializers.IntegerField):
    """A JSON integer (not a boolean, not a string of digits) from `min_value` to `max_value`."""

    def __init__(self, *, code: str, message: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.code, self.message = code, message

    def run_validation(self, data: Any = empty) -> Any:
        data = _given(self, data, self.code, self.message)
        if data is None and self.allow_null:
            return None
        if (
            isinstance(data, bool)
            or not isinstance(data, int)
            or (self.min_value is not None and data < self.min_value)
            or (self.max_value is not None and data > self.max_value)
        ):
            _refuse(self, self.code, self.message)
        return data


class Choice(serializers.ChoiceField):
    """One of `choices`, exactly (no `str()` of another type)."""

    def __init__(self, choices: Sequence[str], *, code: str, message: str, **kwargs: Any) -> None:
        super().__init__(choices=list(choices), **kwargs)
        self.code, self.message = code, message

    def run_validation(self, data: Any = empty) -> Any:
        data = _given(self, data, self.code, self.message)
        if not isinstance(data, str) or data not in self.choices:
            _refuse(self, self.code, self.message)
        return data


class Flag(serializers.BooleanField):
    """`true` or `false` (not 1, not "yes")."""

    def __init__(self, *, code: str, message: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.code, self.message = code, message

    def run_validation(self, data: Any = empty) -> Any:
        data = _given(self, data, self.code, self.message)
        if not isinstance(data, bool):
            _refuse(self, self.code, self.message)
        return data


class Strings(serializers.ListField):
    """A list of strings that `valid` accepts as a whole (at most `max_length` of them); kept as
    a tuple (`null` is the empty one where `allow_null`)."""

    def __init__(self, *, code: str, message: str, valid: Callable[[list[str]], bool], **kwargs: Any) -> None:
        super().__init__(child=serializers.CharField(), **kwargs)
        self.code, self.message, self.valid = code, message, valid

    def run_validation(self, data: Any = empty) -> Any:
        data = _given(self, data, self.code, self.message)
        if data is None and self.allow_null:
            return ()
        if (
            not isinstance(data, list)
            or (self.max_length is not None and len(data) > self.max_length)
            or not all(isinstance(item, str) and NUL not in item for item in data)
            or not self.valid(data)
        ):
            _refuse(self, self.code, self.message)
        return tuple(data)


class Amount(serializers.CharField):
    """A positive decimal amount, given as a JSON number or a decimal string; `convert` turns it
    into the value kept (and raises ValueError or ArithmeticError for one it cannot hold)."""

    def __init__(self, *, code: str, message: str, convert: Callable[[Any], Decimal], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.code, self.message, self.convert = code, message, convert

    def run_validation(self, data: Any = empty) -> Any:
        data = _given(self, data, self.code, self.message)
        if isinstance(data, bool) or not isinstance(data, int | float | str):
            _refuse(self, self.code, self.message)
        try:
            value = self.convert(data)
        except (ValueError, ArithmeticError):
            _refuse(self, self.code, self.message)
        if value <= 0:
            _refuse(self, self.code, self.message)
        return value
