"""The small predicate language of approval policies: JSON data, validated, never evaluated as code.

A policy's `predicates` is a list; the call matches when every item holds. An item is either a
comparison `{"arg": <name>, "op": <op>, "value": <value>}`, a group `{"any": [<item>, ...]}` (at least
one holds) or `{"all": [<item>, ...]}` (every one holds: `(a and b) or c` is
`[{"any": [{"all": [a, b]}, c]}]`); groups nest at most two deep. Operators:

- `>`, `>=`, `<`, `<=`, `==`, `!=` against a number (`==` / `!=` also against a string or a bool);
- `in`, `not_in` against a list of at most 200 strings, numbers or bools;
- `domain_in`, `domain_not_in` against a list of domains: the argument is an e-mail address, a URL
  or a host name (or a list of them); `example.com` covers `pay.example.com`.

When in doubt, ask a human: a predicate about an argument that is missing or of another type
than the comparison needs (an amount sent as a string, NaN, a recipient that is not an address)
*holds*, so the call needs approval rather than slipping past it.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

COMPARISONS = (">", ">=", "<", "<=", "==", "!=")
MEMBERSHIP = ("in", "not_in")
DOMAINS = ("domain_in", "domain_not_in")
OPS = COMPARISONS + MEMBERSHIP + DOMAINS
GROUPS = ("any", "all")
MAX_ITEMS = 20
MAX_LIST = 200
MAX_DEPTH = 3
NAME_MAX = 100
TEXT_MAX = 200


class InvalidPredicate(ValueError):
    """A predicate list that is not of the language (the message says where)."""


def _number(value: Any) -> Decimal | None:
    """A finite number as a Decimal, else None (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    try:
        number = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    except (InvalidOperation, ValueError):
        return None
    return number if number.is_finite() else None


def _scalar(value: Any) -> bool:
    return (
        isinstance(value, bool)
        or (isinstance(value, str) and len(value) <= TEXT_MAX and "\x00" not in value)
        or _number(value) is not None
    )


def _valid_domain(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= 253
        and all(
            part and (part.isalnum() or set(part) <= set("abcdefghijklmnopqrstuvwxyz0123456789-"))
            for part in value.lower().split(".")
        )
    )


def validate(predicates: Any, *, depth: int = 0, where: str = "predicates") -> list[dict[str, Any]]:
    """The predicate list, checked and normalised (domains lower-cased); InvalidPredicate else."""
    if not isinstance(predicates, list) or len(predicates) > MAX_ITEMS:
        raise InvalidPredicate(f"{where}: a list of at most {MAX_ITEMS} predicates")
    out: list[dict[str, Any]] = []
    for n, item in enumerate(predicates):
        here = f"{where}[{n}]"
        if not isinstance(item, dict):
            raise InvalidPredicate(f"{here}: an object")
        if len(item) == 1 and set(item) <= set(GROUPS):
            (kind,) = item
            if depth + 1 >= MAX_DEPTH:
                raise InvalidPredicate(f"{here}: nested at most {MAX_DEPTH - 1} levels deep")
            inner = validate(item[kind], depth=depth + 1, where=f"{here}.{kind}")
            if not inner:
                raise InvalidPredicate(f"{here}.{kind}: at least one predicate")
            out.append({kind: inner})
            continue
        if set(item) != {"arg", "op", "value"}:
            raise InvalidPredicate(f'{here}: {{"arg", "op", "value"}}, {{"any": [...]}} or {{"all": [...]}}')
        arg, op, value = item["arg"], item["op"], item["value"]
        if not isinstance(arg, str) or not 0 < len(arg) <= NAME_MAX or "\x00" in arg:
            raise InvalidPredicate(f"{here}.arg: an argument name of 1 to {NAME_MAX} characters")
        if op not in OPS:
            raise InvalidPredicate(f"{here}.op: one of {', '.join(OPS)}")
        if op in COMPARISONS:
            if op in ("==", "!=") and not _scalar(value):
                raise InvalidPredicate(f"{here}.value: a number, a string or a bool")
            if op not in ("==", "!=") and _number(value) is None:
                raise InvalidPredicate(f"{here}.value: a finite number")
        elif op in MEMBERSHIP:
            if not isinstance(value, list) or len(value) > MAX_LIST or not all(_scalar(v) for v in value):
                raise InvalidPredicate(
                    f"{here}.value: a list of at most {MAX_LIST} strings, numbers or bools"
                )
        else:
            if (
                not isinstance(value, list)
                or not 0 < len(value) <= MAX_LIST
                or not all(_valid_domain(v) for v in value)
            ):
                raise InvalidPredicate(f"{here}.value: a list of 1 to {MAX_LIST} domain names")
            value = [v.lower() for v in value]
        out.append({"arg": arg, "op": op, "value": value})
    return out


def _domain_of(value: str) -> str | None:
    text = value.strip().lower()
    if "@" in text:
        text = text.rsplit("@", 1)[1].strip(" >")
    elif "://" in text:
        text = urllib.parse.urlsplit(text).hostname or ""
    text = text.rstrip(".")
    return text if _valid_domain(text) else None


def _covered(domain: str, listed: list[str]) -> bool:
    return any(domain == d or domain.endswith("." + d) for d in listed)


def _equal(left: Any, right: Any) -> bool:
    a, b = _number(left), _number(right)
    if a is not None and b is not None:
        return a == b
    return type(left) is type(right) and left == right


def _holds(item: Mapping[str, Any], args: Mapping[str, Any]) -> bool:
    if "any" in item:
        return any(_holds(inner, args) for inner in item["any"])
    if "all" in item:
        return all(_holds(inner, args) for inner in item["all"])
    name, op, value = item["arg"], item["op"], item["value"]
    if name not in args:
        return True  # unknown: ask
    actual = args[name]
    if op in ("==", "!="):
        if not _scalar(actual):
            return True
        return _equal(actual, value) == (op == "==")
    if op in COMPARISONS:
        number, bound = _number(actual), _number(value)
        if number is None or bound is None:
            return True
        return {
            ">": number > bound,
            ">=": number >= bound,
            "<": number < bound,
            "<=": number <= bound,
        }[op]
    if op in MEMBERSHIP:
        if not _scalar(actual):
            return True
        inside = any(_equal(actual, v) for v in value)
        return inside == (op == "in")
    targets = actual if isinstance(actual, list) else [actual]
    if not targets or len(targets) > MAX_LIST or not all(isinstance(t, str) for t in targets):
        return True
    domains = [_domain_of(t) for t in targets]
    if any(d is None for d in domains):
        return True
    if op == "domain_in":
        return any(_covered(d, value) for d in domains if d is not None)
    return any(not _covered(d, value) for d in domains if d is not None)


def matches(predicates: list[dict[str, Any]], args: Mapping[str, Any]) -> bool:
    """Every predicate holds for these arguments (an empty list always does)."""
    return all(_holds(item, args) for item in predicates)
