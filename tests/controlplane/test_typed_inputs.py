"""One typed input per command (issue 25, step 5; docs/ARCHITECTURE.md §1 and the error shape):
an API view hands its body to an `Input` (core/inputs.py: `X.parse(request.data)` or
`X.parse_change(current, request.data, ...)`), which validates it, types the service's argument
and is the operation's documented request schema. Parsed, not imported, as test_layering.py does.

A view that still reads its body by hand, or documents it with an `inline_serializer` that checks
nothing, is listed in HAND_PARSED with why; the list only shrinks (docs/DESIGN-NOTES.md, "Typed
inputs ... Left for step 5, and why").
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARSERS = ("parse", "parse_change")

# Views whose body is not parsed by an Input, each with why (docs/DESIGN-NOTES.md: "The redaction's
# and the export's bodies stay DRF serializers" and "Issue 25's speed check, measured").
HAND_PARSED: dict[str, str] = {
    # DRF's `fields` map, sentences and coercion ("5" is 5): tests/hostile/test_serializer_bodies.py
    "audit.api.RedactionView.post": "a DRF serializer of its own (DRF's field paths and sentences)",
    "transparency.api.ExportListView.post": "a DRF serializer of its own (DRF's field paths and sentences)",
    # An Input costs ~199 µs a call against gate_call's 4 µs, a sixth of the gate route's CPU.
    "fleet.api.GateEvaluateView.post": "the gate's call, parsed by gate_call, as the fast route does",
    "fleet.api.GateLeaseView.post": "the gate's call (gate_call) plus calls, lease_id and returns",
}


def _api_modules(root: Path) -> list[tuple[str, Path]]:
    return [(f"{path.parent.name}.api", path) for path in sorted(root.glob("*/api.py"))]


def _reads_body_by_hand(function: ast.FunctionDef) -> bool:
    """Whether `function` reads `request.data` other than as the argument of an Input's parser, or
    documents its request with `inline_serializer(...)`."""
    parsed: set[int] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PARSERS:
            parsed.update(id(arg) for arg in node.args)
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "data"
            and isinstance(node.value, ast.Name)
            and node.value.id == "request"
            and id(node) not in parsed
        ):
            return True
    return any(
        keyword.arg == "request"
        and isinstance(keyword.value, ast.Call)
        and isinstance(keyword.value.func, ast.Name)
        and keyword.value.func.id == "inline_serializer"
        for decorator in function.decorator_list
        if isinstance(decorator, ast.Call)
        for keyword in decorator.keywords
    )


def hand_parsed(root: Path) -> set[str]:
    """module.Class.method of every API view method that reads its body by hand."""
    found = set()
    for module, path in _api_modules(root):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                found.update(
                    f"{module}.{node.name}.{method.name}"
                    for method in node.body
                    if isinstance(method, ast.FunctionDef) and _reads_body_by_hand(method)
                )
    return found


def test_api_bodies_are_parsed_by_typed_inputs() -> None:
    assert sorted(hand_parsed(ROOT) - set(HAND_PARSED)) == [], (
        "parse the body with an Input (core/inputs.py) and declare it as the request schema"
    )


def test_the_hand_parsed_views_only_shrink() -> None:
    assert sorted(set(HAND_PARSED) - hand_parsed(ROOT)) == [], (
        "these views parse their body with an Input now: delete their HAND_PARSED entries"
    )


def test_a_body_read_by_hand_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / "api.py").write_text(
        "class Typed:\n"
        "    def post(self, request):\n"
        "        return services.BudgetCreate.parse(request.data)\n"
        "class Changed:\n"
        "    def patch(self, request):\n"
        "        return services.BudgetCreate.parse_change(current, request.data, fixed=())\n"
        "class ByHand:\n"
        "    def post(self, request):\n"
        "        return request.data.get('amount')\n"
        "class DocumentedOnly:\n"
        "    @extend_schema(request=inline_serializer('X', {}))\n"
        "    def post(self, request):\n"
        "        return services.BudgetCreate.parse({})\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert hand_parsed(ROOT) == {"fleet.api.ByHand.post", "fleet.api.DocumentedOnly.post"}
