"""The approval policy's rule builder: predicates as rows (argument, operator, value, and "or"
with the row above) and escalation as levels (after how many minutes, which roles, which people),
converted here to the body the API takes (`approvals.services.PolicyCreate` / `PolicyChange`
check it: one validation), and a policy's terms back to rows for its Edit form.

Nothing is typed as JSON. A value is read as a number when it spells one (`10000`, `2.5`), as
true or false when it says so, else as text; a list (`is one of`, domains) is comma-separated.
Rows joined by "or" form an `{"any": [...]}` group. A group of rows ("all of" or "any of" them:
`{"all": [...]}` / `{"any": [...]}`) takes a row's place in that chain, so `(a and b) or c` is a
group of a and b with c joined by "or". A policy whose predicates the rows cannot show as they are
(a group in a group, only the API can make one) keeps them: its form shows them read-only and
changes the rest.

The rows are plain form fields (`c<n>_arg`, `c<n>_op`, `c<n>_value`, `c<n>_join`, `c<n>_group`;
`g<k>_mode`; `e<n>_after`, `e<n>_roles`, `e<n>_members`) with their count in `conditions` /
`levels`; adding or removing a row or a group is a submit button (`builder`), so the builder needs
no script under the CSP.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from core.errors import DomainError
from core.numbers import ascii_int

MAX_CONDITIONS = 20
MAX_GROUPS = 10
GROUP_MODES = [("all", "all of these hold"), ("any", "any of these holds")]
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
    modes: dict[int, str] = field(default_factory=dict)  # each group's "all" or "any"

    def entries(self) -> list[dict[str, Any]]:
        """The rows as the form shows them: a row alone (`group` None) or a group with its rows
        and its place among the groups (`number`, from 1), each row with its index `n`, in order
        (a group where its first row is)."""
        shown: list[dict[str, Any]] = []
        groups: dict[int, dict[str, Any]] = {}
        for n, row in enumerate(self.conditions):
            k = row.get("group")
            if k is None:
                shown.append({"group": None, "rows": [{**row, "n": n}]})
            elif k in groups:
                groups[k]["rows"].append({**row, "n": n})
            else:
                groups[k] = {
                    "group": k,
                    "number": len(groups) + 1,
                    "mode": self.modes.get(k, "all"),
                    "rows": [{**row, "n": n}],
                }
                shown.append(groups[k])
        return shown


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


def _group(post: Any, n: int) -> int | None:
    k = ascii_int(str(post.get(f"c{n}_group", "") or "").strip(), max_digits=2)
    return k if k is not None and 0 <= k < MAX_GROUPS else None


def posted(post: Any) -> Builder:
    """The rows as posted (blank rows kept, so the form shows what was typed)."""
    conditions = [
        {
            "arg": str(post.get(f"c{n}_arg", "") or "")[:200],
            "op": str(post.get(f"c{n}_op", "") or "")[:20],
            "value": str(post.get(f"c{n}_value", "") or "")[:5000],
            "join": "or" if post.get(f"c{n}_join") == "or" and n > 0 else "and",
            "group": _group(post, n),
        }
        for n in range(_count(post, "conditions", MAX_CONDITIONS))
    ]
    groups = {_group(post, n) for n in range(len(conditions))}
    modes = {k: "any" if post.get(f"g{k}_mode") == "any" else "all" for k in groups if k is not None}
    levels = [
        {
            "after": str(post.get(f"e{n}_after", "") or "")[:20],
            "roles": [r for r in post.getlist(f"e{n}_roles") if isinstance(r, str)][:10],
            "members": str(post.get(f"e{n}_members", "") or "")[:5000],
        }
        for n in range(_count(post, "levels", MAX_LEVELS))
    ]
    return Builder(conditions=conditions, levels=levels, modes=modes)


def _blank(row: dict[str, Any]) -> bool:
    return not row["arg"].strip() and not row["value"].strip()


def _comparison(row: dict[str, Any]) -> dict[str, Any]:
    op = row["op"]
    if op in LIST_OPERATORS:
        value: Any = [_value(v) for v in row["value"].split(",") if v.strip()]
    elif op in NUMBER_OPERATORS:  # 10,000 and 10 000 read as the number they group
        value = _value(re.sub(r"[ ,_]", "", row["value"]))
    else:
        value = _value(row["value"])
    return {"arg": row["arg"].strip(), "op": op, "value": value}


def predicates_of(builder: Builder) -> list[Any]:
    """The predicate list the rows say (blank rows, and groups of blank rows, left out): each row a
    comparison, each group `{mode: [its rows]}`, rows and groups joined by "or" one `any` group.
    The values are handed on as read; `approvals.predicates` judges them."""
    runs: list[list[dict[str, Any]]] = []
    for shown in builder.entries():
        filled = [row for row in shown["rows"] if not _blank(row)]
        if not filled:
            continue
        if shown["group"] is None:
            item = _comparison(filled[0])
        else:
            item = {shown["mode"]: [_comparison(row) for row in filled]}
        if shown["rows"][0]["join"] == "or" and runs:
            runs[-1].append(item)
        else:
            runs.append([item])
    built: list[Any] = [run[0] if len(run) == 1 else {"any": run} for run in runs]
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


def _row(item: dict[str, Any], join: str, group: int | None) -> dict[str, Any]:
    return {
        "arg": item["arg"],
        "op": item["op"],
        "value": _spelled(item["value"]),
        "join": join,
        "group": group,
    }


def _kind(item: dict[str, Any]) -> str | None:
    """The item's group kind ("any", "all"), or None for a comparison."""
    return next((kind for kind in ("any", "all") if kind in item), None)


def _rows(predicates: list[Any]) -> tuple[list[dict[str, Any]], dict[int, str]] | None:
    """The rows (and their groups' modes) that give `predicates` back exactly, or None when the
    rows cannot: a group holding a group, unless it is an "or" chain of two or more."""
    rows: list[dict[str, Any]] = []
    modes: dict[int, str] = {}
    for item in predicates:
        kind = _kind(item)
        # An "any" of two or more is rows (or groups) joined by "or"; of one, a group of its own.
        chain = item["any"] if kind == "any" and len(item["any"]) > 1 else [item]
        for n, inner in enumerate(chain):
            join = "or" if n > 0 else "and"
            inner_kind = _kind(inner)
            if inner_kind is None:
                rows.append(_row(inner, join, None))
                continue
            if any(_kind(leaf) for leaf in inner[inner_kind]) or len(modes) >= MAX_GROUPS:
                return None
            k = len(modes)
            modes[k] = inner_kind
            rows.extend(_row(leaf, join, k) for leaf in inner[inner_kind])
    return rows, modes


def stored(predicates: list[Any], escalation: list[dict[str, Any]], emails: dict[int, str]) -> Builder:
    """A policy's predicates and escalation as the Edit form's rows (members by e-mail)."""
    shown = _rows(predicates)
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
    if shown is None or len(shown[0]) > MAX_CONDITIONS:
        return Builder(conditions=[], levels=levels, kept=list(predicates))
    return Builder(conditions=shown[0], levels=levels, modes=shown[1])


def _index(action: str, prefix: str) -> int | None:
    return ascii_int(action.removeprefix(prefix), max_digits=3) if action.startswith(prefix) else None


def _conditions_after(builder: Builder, action: str) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The condition rows (and group modes) after adding or removing one row or group."""
    conditions, modes = list(builder.conditions), dict(builder.modes)
    blank: dict[str, Any] = {"arg": "", "op": ">", "value": "", "join": "and", "group": None}
    removed = _index(action, "remove-condition-")
    if removed is not None and removed < len(conditions):
        row = conditions.pop(removed)
        after = conditions[removed] if removed < len(conditions) else None
        first = removed == 0 or conditions[removed - 1].get("group") != row.get("group")
        if (
            first
            and after is not None
            and row.get("group") is not None
            and after.get("group") == row["group"]
        ):
            conditions[removed] = {**after, "join": row["join"]}  # the group keeps its join
    room = len(conditions) < MAX_CONDITIONS
    grown = _index(action, "add-to-group-")
    if grown is not None and room and any(c.get("group") == grown for c in conditions):
        last = max(n for n, c in enumerate(conditions) if c.get("group") == grown)
        conditions.insert(last + 1, {**blank, "group": grown})
    free = [k for k in range(MAX_GROUPS) if all(c.get("group") != k for c in conditions)]
    if action == "add-group" and room and free:
        conditions.append({**blank, "group": free[0]})
        modes[free[0]] = "all"
    if (action == "add-condition" or not conditions) and len(conditions) < MAX_CONDITIONS:
        conditions.append(dict(blank))
    if conditions:
        conditions[0] = {**conditions[0], "join": "and"}
    return conditions, modes


def shown(builder: Builder, action: str = "") -> Builder:
    """The rows to render: after an add or remove (`action`), with one blank row to fill."""
    conditions, modes = _conditions_after(builder, action)
    levels = list(builder.levels)
    removed = _index(action, "remove-level-")
    if removed is not None and removed < len(levels):
        del levels[removed]
    if action == "add-level" and len(levels) < MAX_LEVELS:
        levels.append({"after": "", "roles": [], "members": ""})
    return Builder(conditions=conditions, levels=levels, kept=builder.kept, modes=modes)


# ------------------------------------------------------------------------------- reading


def sentence(predicates: list[Any]) -> str:
    """The predicates as one sentence: `amount is more than 10000 and (to ... or ...)`."""

    def one(item: dict[str, Any]) -> str:
        if "any" in item:
            return "(" + " or ".join(one(inner) for inner in item["any"]) + ")"
        if "all" in item:
            return "(" + " and ".join(one(inner) for inner in item["all"]) + ")"
        return f"{item['arg']} {OPERATOR_TEXT.get(item['op'], item['op'])} {_spelled(item['value'])}"

    return " and ".join(one(item) for item in predicates)


def minutes_text(seconds: int) -> str:
    """A deadline in minutes, as it is asked (`90 min`; `0.5 min` when not whole)."""
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds / 60:g} min"
