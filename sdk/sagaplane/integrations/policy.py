"""The tool policy file: what each tool of a tool source does to the world, and how to undo it.

One TOML file, shared by the MCP gateway (`sagaplane mcp-gateway --policy FILE`), the recovery
worker that finishes a dead gateway's sagas (`sagaplane worker --policy FILE`) and the framework
adapters (`sagaplane.integrations.langgraph`, `.openai_agents`). Read with `load(path)`; every
mistake is refused at load as a `PolicyError` naming the file and line (`policy.toml:12: ...`).

    name = "shop"          # this tool source; its compensators are named "shop:<tool>"
    default = "deny"       # tools not named below: "deny" (refused before the call), or
                           # "PREVIEW" / "IRREVERSIBLE" (governed as that)

    [tools.search_products]
    semantics = "PREVIEW"

    [tools.charge_card]
    semantics = "COMPENSABLE"
    compensate = { tool = "refund_charge", arguments = { charge_id = "{result.id}" } }
    gate_args = { amount = "{args.charge.amount}" }   # what budgets and approvals read

    [tools.set_address]
    semantics = "REVERSIBLE"
    capture = { tool = "get_address", arguments = { user = "{args.user}" } }
    compensate = { tool = "set_address", arguments = { user = "{args.user}", address = "{state.address}" } }

    [tools."delete_*"]      # a glob (fnmatch): the exact name wins, then globs in file order; names
                            # compare as the gate compares them (case-insensitively after NFKC)
    semantics = "IRREVERSIBLE"

Per tool: `semantics` (PREVIEW, REVERSIBLE, COMPENSABLE, IRREVERSIBLE; required); `compensate`
(required for REVERSIBLE and COMPENSABLE, refused for the others): another call of the same tool
source, its `arguments` templated; `capture` (optional, needs `compensate`): a read-only call
made before the effect, whose result the compensation reads as `{state.<path>}`; `gate_args`
(optional): arguments for the gate (budgets, rate limits, approval predicates) added to the
call's own; `on_error` (optional): what a result the tool itself marks as an error means,
"unknown" (default: the effect may have happened; it is compensated, idempotently, when the
compensation can be built without the result) or "not_applied" (nothing happened).
`retry` (optional): `{ max_attempts = 3, backoff = "exponential" | "linear", base_s, cap_s,
jitter = true, retry_on = ["TimeoutError"], no_retry_on = [...] }` (sagaplane.retry.Retry; class
names; a result the tool marks as an error is `ToolFailed`); `fallback` (optional): `{ tool =
"<another tool this file allows>", arguments = { ... } }`, called once the attempts are exhausted
and none may have applied, with the call's own arguments when `arguments` is left out (its
templates read `{args.…}` only); `secret` (optional): `["api_key", ...]`, arguments whose values
are credential references' names, resolved at call time and recorded as references
(sagaplane.credentials). `reserve` / `settle` (optional; sagaplane.reservations): the estimate the
gate reserves, a template over `args` (`"{args.max_tokens}"`), and the actual settled from the
`result` (`"{result.usage.total_tokens}"`; unreadable: settled at the estimate at the saga's end).

Templates: a string that is exactly one `{args.<path>}`, `{result.<path>}` or `{state.<path>}`
is replaced by that value with its type (a number stays a number, an object an object); inside
a longer string each placeholder is replaced by its text (JSON for objects). A path is dotted
keys, with list indices as numbers (`{result.items.0.id}`); `{args}` alone is the whole
argument object. `{{` and `}}` are literal braces. `args` is the forward call's arguments,
`result` its result (for MCP: its `structuredContent`, else the JSON of its first text
content), `state` the capture's result. A path missing at run time makes the compensation
unbuildable: the step has no inverse and recovery escalates it to a person.
"""

from __future__ import annotations

import json
import logging
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import names
from ..reservations import settle
from ..retry import BACKOFFS, Retry
from ..semantics import COMPENSABLE, IRREVERSIBLE, PREVIEW, REVERSIBLE, Semantics

logger = logging.getLogger("sagaplane.integrations")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TOP_KEYS = frozenset({"name", "default", "tools"})
TOOL_KEYS = frozenset({"semantics", "compensate", "capture", "gate_args", "on_error", "retry", "fallback"})
TOOL_KEYS |= {"secret", "reserve", "settle"}
RETRY_KEYS = frozenset({"max_attempts", "backoff", "base_s", "cap_s", "jitter", "retry_on", "no_retry_on"})
MAX_ATTEMPTS = 100
_ERROR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ARGUMENT = re.compile(r"^[^\s.{}]{1,200}$")
CALL_KEYS = frozenset({"tool", "arguments"})
DENY = "deny"
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_PATH = re.compile(r"^(args|result|state)((?:\.[^.{}\s]+)*)$")
MAX_POLICY_BYTES = 1 << 20


class PolicyError(ValueError):
    """The policy file is wrong: `file:line: message`."""

    def __init__(self, path: str, line: int, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        super().__init__(f"{path}:{line}: {message}")


class TemplateError(LookupError):
    """A placeholder names a value the call does not have (at run time)."""


# -- templates -----------------------------------------------------------------------------------


def _lookup(scope: Mapping[str, Any], expression: str) -> Any:
    root, *parts = expression.split(".")
    if root not in scope:
        raise TemplateError(f"{{{expression}}}: no {root} here")
    value = scope[root]
    for part in parts:
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise TemplateError(f"{{{expression}}}: {part!r} is not in the {root}")
    return value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def render(template: Any, scope: Mapping[str, Any]) -> Any:
    """The template with its placeholders replaced from `scope` ({"args": ..., "result": ...,
    "state": ...}). Raises TemplateError for a path the scope lacks."""
    if isinstance(template, dict):
        return {key: render(value, scope) for key, value in template.items()}
    if isinstance(template, list):
        return [render(value, scope) for value in template]
    if not isinstance(template, str):
        return template
    whole = _PLACEHOLDER.fullmatch(template)
    if whole is not None and whole.group(1) is not None:
        return _lookup(scope, whole.group(1).strip())

    def one(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return match.group(0)[0]
        return _text(_lookup(scope, match.group(1).strip()))

    return _PLACEHOLDER.sub(one, template)


def _roots(template: Any) -> set[str]:
    """The roots (args/result/state) a template reads; ValueError for a malformed placeholder."""
    if isinstance(template, dict):
        return set().union(*(_roots(v) for v in template.values())) if template else set()
    if isinstance(template, list):
        return set().union(*(_roots(v) for v in template)) if template else set()
    if not isinstance(template, str):
        return set()
    found: set[str] = set()
    for match in _PLACEHOLDER.finditer(template):
        if match.group(1) is None:
            continue
        expression = match.group(1).strip()
        parsed = _PATH.match(expression)
        if parsed is None:
            raise ValueError(
                f"placeholder {{{expression}}}: use {{args.<path>}}, {{result.<path>}} or {{state.<path>}}"
            )
        found.add(parsed.group(1))
    stray = _PLACEHOLDER.sub("", template)
    if "{" in stray or "}" in stray:
        raise ValueError(f"unbalanced brace in {template!r} (write {{{{ or }}}} for a literal one)")
    return found


# -- the policy ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallTemplate:
    """Another call of the same tool source: `tool` with templated `arguments`."""

    tool: str
    arguments: dict[str, Any]

    def render(self, scope: Mapping[str, Any]) -> dict[str, Any]:
        rendered = render(self.arguments, scope)
        assert isinstance(rendered, dict)
        return rendered


@dataclass(frozen=True)
class ToolRule:
    pattern: str  # a tool name or a glob; "*" for the file's default
    semantics: Semantics
    compensate: CallTemplate | None = None
    capture: CallTemplate | None = None
    gate_args: dict[str, Any] | None = None
    on_error: str = "unknown"  # or "not_applied"
    line: int = 0
    retry: Retry | None = None
    fallback: CallTemplate | None = None  # arguments {} and `same_arguments`: the call's own
    fallback_same_arguments: bool = True
    secret: tuple[str, ...] = ()  # arguments whose values are credential references
    reserve: str | None = None  # a template over args: the estimate the gate reserves
    settle: str | None = None  # a template over result: the actual amount settled

    def estimate(self, **arguments: Any) -> Any:
        return render(self.reserve, {"args": arguments})

    def settle_with(self, result: Any) -> None:
        """sp.settle() with the amount `settle` reads (unreadable: settled at the saga's end)."""
        if self.settle is None:
            return
        try:
            settle(render(self.settle, {"result": result}))
        except (TemplateError, ValueError, RuntimeError) as exc:
            logger.warning(
                "tools.%s.settle: %s (settled at its estimate when the saga ends)", self.pattern, exc
            )


@dataclass(frozen=True)
class Policy:
    name: str
    default: Semantics | None  # None: tools the file does not name are refused
    rules: tuple[ToolRule, ...]
    path: str = "<policy>"

    def rule_for(self, tool: str) -> ToolRule | None:
        """The rule governing `tool`: its exact entry, else the first glob that matches it, else
        the default (None when the default is "deny"). Names compare as the gate compares them
        (`sagaplane.names`: case-insensitively after NFKC), so `WIRE` cannot dodge `wire`'s rule."""
        for rule in self.rules:
            if names.same_name(rule.pattern, tool):
                return rule
        for rule in self.rules:
            if _is_glob(rule.pattern) and names.glob_matches(rule.pattern, tool):
                return rule
        if self.default is None:
            return None
        return ToolRule("*", self.default)

    def handler_name(self, tool: str) -> str:
        """The registered compensator that calls `tool` of this source (what recovery claims)."""
        return f"{self.name}:{tool}"

    def compensation_tools(self) -> list[str]:
        """Every tool a compensation calls, sorted (the handlers a recovery worker registers)."""
        return sorted({rule.compensate.tool for rule in self.rules if rule.compensate is not None})


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


class _Lines:
    """Which line of the file each key path starts on (tomllib gives values, not positions)."""

    def __init__(self, text: str) -> None:
        self.at: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        in_string: str | None = None
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if in_string is not None:
                if line.count(in_string) % 2 == 1:
                    in_string = None
                continue
            for quote in ('"""', "'''"):
                if line.count(quote) % 2 == 1:
                    in_string = quote
            if not line or line.startswith("#"):
                continue
            if line.startswith("[") and not line.startswith("[["):
                path = _key_path(line)
                if path:
                    table = path
                    self.at.setdefault(table, number)
                continue
            key, sep, _ = _split_assignment(line)
            if sep:
                path = _key_path(key + " = 0")
                if path:
                    self.at.setdefault(table + path, number)

    def line(self, path: Iterable[str]) -> int:
        parts = tuple(path)
        while parts:
            if parts in self.at:
                return self.at[parts]
            parts = parts[:-1]
        return 1


def _split_assignment(line: str) -> tuple[str, str, str]:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "=":
            return line[:i], "=", line[i + 1 :]
    return line, "", ""


def _key_path(fragment: str) -> tuple[str, ...]:
    try:
        parsed: Any = tomllib.loads(fragment)
    except tomllib.TOMLDecodeError:
        return ()
    path: list[str] = []
    while isinstance(parsed, dict) and len(parsed) == 1:
        key = next(iter(parsed))
        path.append(key)
        parsed = parsed[key]
    return tuple(path)


def loads(text: str, path: str = "<policy>") -> Policy:
    """Parse and validate a policy; PolicyError (file:line) for the first mistake."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise PolicyError(path, int(match.group(1)) if match else 1, f"not TOML: {exc}") from None
    return _Parser(path, _Lines(text)).policy(data)


def load(path: str | Path) -> Policy:
    target = Path(path)
    try:
        raw = target.read_bytes()
    except OSError as exc:
        raise PolicyError(str(target), 0, f"cannot read the policy: {exc.strerror or exc}") from None
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(str(target), 0, f"larger than {MAX_POLICY_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(str(target), 1, "not UTF-8") from None
    return loads(text, str(target))


class _Parser:
    def __init__(self, path: str, lines: _Lines) -> None:
        self.path = path
        self.lines = lines

    def fail(self, where: tuple[str, ...], message: str) -> PolicyError:
        return PolicyError(self.path, self.lines.line(where), message)

    def fallbacks(self, rules: tuple[ToolRule, ...], default: Semantics | None) -> None:
        """A fallback names a tool this file governs (a tool it refuses cannot be fallen back to)."""
        probe = Policy("probe", default, rules, self.path)
        for rule in rules:
            if rule.fallback is not None and probe.rule_for(rule.fallback.tool) is None:
                raise self.fail(
                    ("tools", rule.pattern, "fallback"),
                    f"tools.{rule.pattern}.fallback: {rule.fallback.tool!r} is not a tool this policy allows",
                )

    def policy(self, data: dict[str, Any]) -> Policy:
        unknown = sorted(set(data) - TOP_KEYS)
        if unknown:
            expected = "expected name, default, [tools.<name>]"
            raise self.fail((unknown[0],), f"unknown key {unknown[0]!r} ({expected})")
        name = data.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise self.fail(
                ("name",),
                'name: required, this tool source\'s name (1-64 of A-Z a-z 0-9 . _ -), e.g. name = "shop"',
            )
        default = self.default(data.get("default", DENY))
        tools = data.get("tools", {})
        if not isinstance(tools, dict):
            raise self.fail(("tools",), "tools: a table of [tools.<name>] sections")
        rules = tuple(self.rule(tool, spec) for tool, spec in tools.items())
        self.fallbacks(rules, default)
        return Policy(name, default, rules, self.path)

    def default(self, value: Any) -> Semantics | None:
        if value == DENY:
            return None
        if value in (PREVIEW.value, IRREVERSIBLE.value):
            return Semantics(value)
        if value in (REVERSIBLE.value, COMPENSABLE.value):
            raise self.fail(
                ("default",),
                f"default = {value!r}: a tool the file does not name has no compensation; "
                'use "deny", "PREVIEW" or "IRREVERSIBLE"',
            )
        raise self.fail(("default",), f'default: "deny", "PREVIEW" or "IRREVERSIBLE", not {value!r}')

    def rule(self, tool: str, spec: Any) -> ToolRule:
        where = ("tools", tool)
        if not tool or len(tool) > 200:
            raise self.fail(where, "a tool name or glob of 1-200 characters")
        if not isinstance(spec, dict):
            raise self.fail(where, f"tools.{tool}: a table (semantics = ..., compensate = ...)")
        unknown = sorted(set(spec) - TOOL_KEYS)
        if unknown:
            raise self.fail(
                (*where, unknown[0]),
                f"tools.{tool}: unknown key {unknown[0]!r} (expected {', '.join(sorted(TOOL_KEYS))})",
            )
        raw = spec.get("semantics")
        try:
            semantics = Semantics(raw)
        except ValueError:
            raise self.fail(
                (*where, "semantics"),
                f"tools.{tool}.semantics: one of PREVIEW, REVERSIBLE, COMPENSABLE, IRREVERSIBLE, not {raw!r}",
            ) from None
        compensate = self.call(where, "compensate", spec.get("compensate"))
        capture = self.call(where, "capture", spec.get("capture"))
        undoable = semantics in (REVERSIBLE, COMPENSABLE)
        if undoable and compensate is None:
            raise self.fail(
                (*where, "semantics"),
                f"tools.{tool}: {semantics.value} needs compensate = {{ tool = ..., arguments = {{ ... }} }} "
                "(a tool that cannot be undone is IRREVERSIBLE)",
            )
        if not undoable and compensate is not None:
            raise self.fail(
                (*where, "compensate"), f"tools.{tool}: a {semantics.value} tool has no compensation"
            )
        if capture is not None and compensate is None:
            raise self.fail((*where, "capture"), f"tools.{tool}: capture is only read by a compensation")
        self.roots((*where, "capture"), capture, {"args"})
        self.roots((*where, "compensate"), compensate, {"args", "result"} | ({"state"} if capture else set()))
        gate_args = spec.get("gate_args")
        if gate_args is not None:
            if not isinstance(gate_args, dict):
                raise self.fail((*where, "gate_args"), f"tools.{tool}.gate_args: a table of name = template")
            self.roots((*where, "gate_args"), CallTemplate("", gate_args), {"args"})
        on_error = spec.get("on_error", "unknown")
        if on_error not in ("unknown", "not_applied"):
            raise self.fail((*where, "on_error"), f'tools.{tool}.on_error: "unknown" or "not_applied"')
        line = self.lines.line(where)
        fallback = self.call(where, "fallback", spec.get("fallback"))
        if fallback is not None:
            self.roots((*where, "fallback"), fallback, {"args"})
            if names.same_name(fallback.tool, tool):
                raise self.fail((*where, "fallback"), f"tools.{tool}.fallback: another tool than {tool!r}")
        reserve, settled = (
            self.amount(where, spec, "reserve", {"args"}),
            self.amount(where, spec, "settle", {"result"}),
        )
        if settled is not None and reserve is None:
            raise self.fail((*where, "settle"), f"tools.{tool}.settle: settles what `reserve` reserved")
        same = not isinstance(spec.get("fallback"), dict) or "arguments" not in spec["fallback"]
        return ToolRule(
            tool,
            semantics,
            compensate,
            capture,
            gate_args,
            on_error,
            max(line, 1),
            retry=self.retry(where, spec.get("retry")),
            fallback=fallback,
            fallback_same_arguments=same,
            secret=self.secret(where, spec.get("secret")),
            reserve=reserve,
            settle=settled,
        )

    def amount(self, where: tuple[str, ...], spec: dict[str, Any], key: str, allowed: set[str]) -> str | None:
        value = spec.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise self.fail(
                (*where, key), f'tools.{where[1]}.{key}: a template such as "{{args.max_tokens}}"'
            )
        self.roots((*where, key), CallTemplate("", {key: value}), allowed)
        return value

    def retry(self, where: tuple[str, ...], value: Any) -> Retry | None:
        """`retry = { max_attempts = 3, backoff = "exponential", base_s = 0.2, cap_s = 5, jitter = true,
        retry_on = ["TimeoutError"], no_retry_on = [...] }` (sagaplane.retry.Retry)."""
        if value is None:
            return None
        at, label = (*where, "retry"), f"tools.{where[-1]}.retry"
        if not isinstance(value, dict):
            raise self.fail(at, f'{label}: a table {{ max_attempts = 3, backoff = "exponential", ... }}')
        unknown = sorted(set(value) - RETRY_KEYS)
        if unknown:
            raise self.fail(
                at, f"{label}: unknown key {unknown[0]!r} (expected {', '.join(sorted(RETRY_KEYS))})"
            )
        attempts = value.get("max_attempts", 3)
        if type(attempts) is not int or not 1 <= attempts <= MAX_ATTEMPTS:
            raise self.fail(at, f"{label}.max_attempts: an integer from 1 to {MAX_ATTEMPTS}")
        if value.get("backoff", "exponential") not in BACKOFFS:
            raise self.fail(at, f"{label}.backoff: one of {', '.join(repr(b) for b in BACKOFFS)}")
        for key in ("base_s", "cap_s"):
            number = value.get(key, 0)
            if type(number) not in (int, float) or not 0 <= number <= 86_400:
                raise self.fail(at, f"{label}.{key}: seconds from 0 to 86400")
        if type(value.get("jitter", True)) is not bool:
            raise self.fail(at, f"{label}.jitter: true or false")
        kinds: dict[str, tuple[str, ...]] = {}
        for key in ("retry_on", "no_retry_on"):
            listed = value.get(key, ["Exception"] if key == "retry_on" else [])
            if not isinstance(listed, list) or not all(
                isinstance(n, str) and _ERROR_NAME.match(n) for n in listed
            ):
                raise self.fail(at, f'{label}.{key}: a list of exception class names, e.g. ["TimeoutError"]')
            kinds[key] = tuple(listed)
        options = {
            k: value[k] for k in ("max_attempts", "backoff", "base_s", "cap_s", "jitter") if k in value
        }
        return Retry(**options, retry_on=kinds["retry_on"], no_retry_on=kinds["no_retry_on"])

    def secret(self, where: tuple[str, ...], value: Any) -> tuple[str, ...]:
        """`secret = ["api_key"]`: arguments whose values are credential references, resolved at call
        time by the agent's resolver and recorded as references (sagaplane.credentials)."""
        if value is None:
            return ()
        ok = isinstance(value, list) and all(isinstance(n, str) and _ARGUMENT.match(n) for n in value)
        if not ok or len(set(value)) != len(value):
            raise self.fail(
                (*where, "secret"), f'tools.{where[-1]}.secret: a list of argument names, e.g. ["api_key"]'
            )
        return tuple(value)

    def call(self, where: tuple[str, ...], key: str, value: Any) -> CallTemplate | None:
        if value is None:
            return None
        label = f"{where[-1]}.{key}"
        if not isinstance(value, dict):
            raise self.fail((*where, key), f'tools.{label}: {{ tool = "...", arguments = {{ ... }} }}')
        unknown = sorted(set(value) - CALL_KEYS)
        if unknown:
            expected = "expected tool, arguments"
            raise self.fail((*where, key), f"tools.{label}: unknown key {unknown[0]!r} ({expected})")
        tool = value.get("tool")
        if not isinstance(tool, str) or not tool or _is_glob(tool):
            raise self.fail((*where, key), f"tools.{label}.tool: the name of one tool of this source")
        arguments = value.get("arguments", {})
        if not isinstance(arguments, dict):
            raise self.fail((*where, key), f"tools.{label}.arguments: a table of name = value or template")
        return CallTemplate(tool, arguments)

    def roots(self, where: tuple[str, ...], call: CallTemplate | None, allowed: set[str]) -> None:
        if call is None:
            return
        try:
            used = _roots(call.arguments)
        except ValueError as exc:
            raise self.fail(where, f"tools.{where[1]}.{where[2]}: {exc}") from None
        extra = sorted(used - allowed)
        if extra:
            hint = " (add a capture)" if extra == ["state"] else ""
            raise self.fail(
                where,
                f"tools.{where[1]}.{where[2]}: {{{extra[0]}.…}} is not available here; "
                f"it may read {', '.join('{' + r + '.…}' for r in sorted(allowed))}{hint}",
            )


# -- observe mode: the skeleton of a policy --------------------------------------------------------


def _toml_key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def skeleton(name: str, tools: Iterable[tuple[str, str]]) -> str:
    """A policy naming every tool seen (name, description), each IRREVERSIBLE with a TODO: the file
    never guesses that something can be undone; people downgrade what is safe."""
    lines = [
        "# Sagaplane tool policy, written by `sagaplane mcp-gateway --observe --emit-policy`.",
        "# Every tool is IRREVERSIBLE until a person says otherwise: mark reads PREVIEW, and give",
        "# what can be undone its compensation (REVERSIBLE / COMPENSABLE + compensate = {...}).",
        f"name = {json.dumps(name)}",
        'default = "deny"',
    ]
    for tool, description in sorted(dict(tools).items()):
        lines.append("")
        lines.append(f"[tools.{_toml_key(tool)}]")
        if description:
            summary = " ".join(description.split())[:200]
            lines.append(f"# {summary}")
        lines.append('semantics = "IRREVERSIBLE"  # TODO: PREVIEW? REVERSIBLE / COMPENSABLE with compensate?')
    return "\n".join(lines) + "\n"


__all__ = [
    "CallTemplate",
    "Policy",
    "PolicyError",
    "TemplateError",
    "ToolRule",
    "load",
    "loads",
    "render",
    "skeleton",
]
