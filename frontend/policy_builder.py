"""The approval policy's rule builder: predicates as rows (argument, operator, value, and "or"
with the row above) and escalation as levels (after how many minutes, which roles, which people),
converted here to the body the API takes (`approvals.services.PolicyCreate` / `PolicyChange`
check it: one validation), and a policy's terms back to rows for its Edit form.

Nothing is typed as JSON. A value is read as a number when it spells one (`10000`, `2.5`), as
true or false when it says so, else as text; a list (`is one of`, domains) is comma-separated.
Rows joined by "or" form an `{"any": [...]}` group. A policy whose predicates nest a group in a
group (only the API can make one) keeps them: its form shows them and changes the rest.

The rows are plain form fields (`c<n>_arg`, `c<n>_op`, `c<n>_value`, `c<n>_join`; `e<n>_after`,
`e<n>_roles`, `e<n>_members`) with their count in `conditions` / `levels`; adding or removing a
row is a submit button (`builder`), so the builder needs no script under the CSP.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from core.errors import DomainError
from core.numbers import ascii_int

MAX_CONDITIONS = 20
MAX_LEVELS = 5
MINUTES_MAX_DIGITS = 8
# (operator, how it reads, what its value is: "number", "scalar", "list" or "domains")
OPERATORS = [
    (">", "is more than", "number"),
    (">=", "is at least", "number"),
    ("<", "is less than", "number"),
    ("<=", "is at most", "number"),
    ("==", "equals", "scalar"),
    ("!=", "does not equal", "scalar"),
    ("in", "is one of", "list"),
    ("not_in", "is none of", "list"),
    ("domain_in", "has a domain among", "domains"),
    ("domain_not_in", "has a domain outside", "domains"),
]
OPERATOR_TEXT = {op: text for op, text, _ in OPERATORS}
LIST_OPERATORS = {op for op, _, kind in OPERATORS if kind in ("list", "domains")}
NUMBER_OPERATORS = {op for op, _, kind in OPERATORS if kind == "number"}
NUMBER_RE = re.compile(r"-?[0-9]{1,30}(\.[0-9]{1,30})?")
COMMON_ARGUMENTS = ["amount", "amount_cents", "currency", "to", "recipient", "email", "url", "customer"]


@dataclass
class Builder:
    """The builder's rows as shown: conditions and escalation levels (as typed or as stored)."""

    conditions: list[dict[str, Any]] = field(default_factory=list)
    levels: list[dict[str, Any]] = field(default_factory=list)
    kept: list[dict[str, Any]] | None = None  # predicates the rows cannot show, kept as they are


# ------------------------------------------------------------------------------- value spelling


def _value(text: str) -> Any:
    """One typed value: a number when it spells one, a bool for true/false, else the text."""
    text = text.strip()
    if NUMBER_RE.fullmatch(text):
        number = Decimal(text)
        return int(number) if number == number.to_integral_value() and "." not in text else float(number)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def _spelled(value: Any) -> str:
    """A stored value as the builder shows it (the inverse of `_value`, lists comma-separated)."""
    if isinstance(value, list):
        return ", ".join(_spelled(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ------------------------------------------------------------------------------- form → body


def _count(post: Any, name: str, high: int) -> int:
    return min(ascii_int(str(post.get(name, "") or "").strip(), max_digits=3) or 0, high)


def posted(post: Any) -> Builder:
    """The rows as posted (blank rows kept, so the form shows what was typed)."""
    conditions = [
        {
            "arg": str(post.get(f"c{n}_arg", "") or "")[:200],
            "op": str(post.get(f"c{n}_op", "") or "")[:20],
            "value": str(post.get(f"c{n}_value", "") or "")[:5000],
            "join": "or" if post.get(f"c{n}_join") == "or" and n > 0 else "and",
        }
        for n in range(_count(post, "conditions", MAX_CONDITIONS))
    ]
    levels = [
        {
            "after": str(post.get(f"e{n}_after", "") or "")[:20],
            "roles": [r for r in post.getlist(f"e{n}_roles") if isinstance(r, str)][:10],
            "members": str(post.get(f"e{n}_members", "") or "")[:5000],
        }
        for n in range(_count(post, "levels", MAX_LEVELS))
    ]
    return Builder(conditions=conditions, levels=levels)


def predicates_of(builder: Builder) -> list[Any]:
    """The predicate list the rows say (blank rows left out): each row a comparison, rows joined by
    "or" one `any` group. The values are handed on as read; `approvals.predicates` judges them."""
    groups: list[list[dict[str, Any]]] = []
    for row in builder.conditions:
        if not row["arg"].strip() and not row["value"].strip():
            continue
        op = row["op"]
        if op in LIST_OPERATORS:
            value: Any = [_value(v) for v in row["value"].split(",") if v.strip()]
        elif op in NUMBER_OPERATORS:  # 10,000 and 10 000 read as the number they group
            value = _value(re.sub(r"[ ,_]", "", row["value"]))
        else:
            value = _value(row["value"])
        item = {"arg": row["arg"].strip(), "op": op, "value": value}
        if row["join"] == "or" and groups:
            groups[-1].append(item)
        else:
            groups.append([item])
    built: list[Any] = [g[0] if len(g) == 1 else {"any": g} for g in groups]
    return (builder.kept or []) + built


def escalation_of(builder: Builder, ttl_s: int) -> list[dict[str, Any]]:
    """The escalation levels the rows say (blank levels left out), minutes as seconds; each level
    later than the one before and before the time to decide, said in minutes as they were asked
    (the service checks the same in seconds)."""
    levels: list[dict[str, Any]] = []
    for n, level in enumerate(builder.levels):
        members = [m.strip() for m in level["members"].split(",") if m.strip()]
        if not level["after"].strip() and not level["roles"] and not members:
            continue
        minutes = ascii_int(level["after"].strip(), max_digits=MINUTES_MAX_DIGITS)
        if minutes is None or minutes < 1:
            raise DomainError(
                "invalid", f"escalation level {n + 1}: after a whole number of minutes", field="escalation"
            )
        earliest = levels[-1]["after_s"] // 60 + 1 if levels else 1
        latest = (ttl_s - 1) // 60
        if not earliest <= minutes <= latest:
            raise DomainError(
                "invalid",
                f"escalation level {n + 1}: after {earliest} to {latest} minutes (later than the level "
                f"above, before the time to decide: {minutes_text(ttl_s)})",
                field="escalation",
            )
        levels.append({"after_s": minutes * 60, "roles": level["roles"], "members": members})
    return levels


# ------------------------------------------------------------------------------- body → rows


def _rows(predicates: list[Any]) -> list[dict[str, Any]] | None:
    """The rows showing `predicates`, or None when a group nests a group."""
    rows: list[dict[str, Any]] = []
    for item in predicates:
        items = item.get("any", [item])
        if any("any" in inner for inner in items):
            return None
        for n, inner in enumerate(items):
            rows.append(
                {
                    "arg": inner["arg"],
                    "op": inner["op"],
                    "value": _spelled(inner["value"]),
                    "join": "or" if n > 0 else "and",
                }
            )
    return rows


def stored(predicates: list[Any], escalation: list[dict[str, Any]], emails: dict[int, str]) -> Builder:
    """A policy's predicates and escalation as the Edit form's rows (members by e-mail)."""
    rows = _rows(predicates)
    levels = [
        {
            "after": str(level["after_s"] // 60)
            if level["after_s"] % 60 == 0
            else f"{level['after_s'] / 60:g}",
            "roles": list(level.get("roles", [])),
            "members": ", ".join(emails.get(m, str(m)) for m in level.get("members", [])),
        }
        for level in escalation
    ]
    if rows is None:
        return Builder(conditions=[], levels=levels, kept=list(predicates))
    return Builder(conditions=rows, levels=levels)


def shown(builder: Builder, action: str = "") -> Builder:
    """The rows to render: after an add or remove (`action`), with one blank row to fill."""
    conditions, levels = list(builder.conditions), list(builder.levels)
    if action.startswith("remove-condition-"):
        n = ascii_int(action.rsplit("-", 1)[1], max_digits=3)
        if n is not None and n < len(conditions):
            del conditions[n]
    if action.startswith("remove-level-"):
        n = ascii_int(action.rsplit("-", 1)[1], max_digits=3)
        if n is not None and n < len(levels):
            del levels[n]
    blank_condition = {"arg": "", "op": ">", "value": "", "join": "and"}
    if (action == "add-condition" or not conditions) and len(conditions) < MAX_CONDITIONS:
        conditions.append(dict(blank_condition))
    if action == "add-level" and len(levels) < MAX_LEVELS:
        levels.append({"after": "", "roles": [], "members": ""})
    if conditions:
        conditions[0] = {**conditions[0], "join": "and"}
    return Builder(conditions=conditions, levels=levels, kept=builder.kept)


# ------------------------------------------------------------------------------- reading


def sentence(predicates: list[Any]) -> str:
    """The predicates as one sentence: `amount is more than 10000 and (to ... or ...)`."""

    def one(item: dict[str, Any]) -> str:
        if "any" in item:
            return "(" + " or ".join(one(inner) for inner in item["any"]) + ")"
        return f"{item['arg']} {OPERATOR_TEXT.get(item['op'], item['op'])} {_spelled(item['value'])}"

    return " and ".join(one(item) for item in predicates)


def minutes_text(seconds: int) -> str:
    """A deadline in minutes, as it is asked (`90 min`; `0.5 min` when not whole)."""
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds / 60:g} min"
