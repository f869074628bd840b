"""The tool policy file: validated at load with file:line errors, matched by name then glob,
templates rendered with their types, and observe mode's skeleton (every tool IRREVERSIBLE)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from sagaplane.integrations import policy
from sagaplane.integrations.policy import PolicyError, TemplateError

GOOD = textwrap.dedent(
    """\
    # a shop
    name = "shop"
    default = "deny"

    [tools.search]
    semantics = "PREVIEW"

    [tools.charge_card]
    semantics = "COMPENSABLE"
    compensate = { tool = "refund", arguments = { charge_id = "{result.id}", note = "undo {args.amount}" } }
    gate_args = { amount = "{args.charge.amount}" }

    [tools.set_address]
    semantics = "REVERSIBLE"
    capture = { tool = "get_address", arguments = { user = "{args.user}" } }
    compensate = { tool = "set_address", arguments = { user = "{args.user}", address = "{state.address}" } }

    [tools."delete_*"]
    semantics = "IRREVERSIBLE"

    [tools."*_report"]
    semantics = "PREVIEW"
    """
)


def test_a_valid_policy_matches_exact_names_first_then_globs_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "shop.toml"
    path.write_text(GOOD)
    loaded = policy.load(path)
    assert loaded.name == "shop" and loaded.default is None
    charge = loaded.rule_for("charge_card")
    assert charge is not None and charge.semantics.value == "COMPENSABLE" and charge.line == 8
    assert charge.compensate is not None and charge.compensate.tool == "refund"
    rule = loaded.rule_for("delete_report")  # both globs match: the first in the file wins
    assert rule is not None and rule.pattern == "delete_*" and rule.semantics.value == "IRREVERSIBLE"
    assert loaded.rule_for("unknown_tool") is None  # default deny
    assert loaded.handler_name("refund") == "shop:refund"
    assert loaded.compensation_tools() == ["refund", "set_address"]


FULLWIDTH_CHARGE = "\uff23\uff28\uff21\uff32\uff27\uff25_card"


@pytest.mark.parametrize("spelling", ["CHARGE_CARD", "Charge_Card", FULLWIDTH_CHARGE])
def test_a_name_cannot_dodge_its_rule_by_case_or_look_alikes(spelling: str) -> None:
    # Matched as the gate matches (sagaplane.names): a default PREVIEW must not govern a spelling
    # of an IRREVERSIBLE or COMPENSABLE tool.
    loaded = policy.loads(GOOD.replace('default = "deny"', 'default = "PREVIEW"'))
    charge = loaded.rule_for(spelling)
    assert charge is not None and charge.pattern == "charge_card", charge
    deleting = loaded.rule_for("DELETE_accounts")
    assert deleting is not None and deleting.semantics.value == "IRREVERSIBLE", deleting


def test_a_default_semantics_governs_unnamed_tools() -> None:
    loaded = policy.loads('name = "x"\ndefault = "PREVIEW"\n')
    rule = loaded.rule_for("anything")
    assert rule is not None and rule.semantics.value == "PREVIEW" and rule.compensate is None


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('name = "x"\n\n[tools.a]\nsemantics = "PREVIEW"\ncolour = 1\n', 5, "unknown key 'colour'"),
        ('name = "x"\n[tools.a]\nsemantics = "SOMETIMES"\n', 3, "one of PREVIEW"),
        ('name = "x"\n\n\n[tools.pay]\nsemantics = "COMPENSABLE"\n', 5, "needs compensate"),
        (
            'name = "x"\n[tools.a]\nsemantics = "PREVIEW"\ncompensate = { tool = "b" }\n',
            4,
            "has no compensation",
        ),
        (
            'name = "x"\n[tools.a]\nsemantics = "COMPENSABLE"\n'
            'compensate = { tool = "b", arguments = { v = "{state.v}" } }\n',
            4,
            "add a capture",
        ),
        (
            'name = "x"\n[tools.a]\nsemantics = "COMPENSABLE"\n'
            'compensate = { tool = "b", arguments = { v = "{env.HOME}" } }\n',
            4,
            "placeholder {env.HOME}",
        ),
        (
            'name = "x"\n[tools.a]\nsemantics = "PREVIEW"\ngate_args = { amount = "{result.x}" }\n',
            4,
            "{result.…} is not available",
        ),
        ('name = "x"\ndefault = "COMPENSABLE"\n', 2, "has no compensation"),
        ('default = "deny"\n', 1, "name: required"),
        ('name = "x"\n[tools.a]\nsemantics = \n', 3, "not TOML"),
        ('name = "x"\nextra = 1\n', 2, "unknown key 'extra'"),
    ],
)
def test_mistakes_are_refused_with_the_file_and_line(text: str, line: int, words: str) -> None:
    with pytest.raises(PolicyError) as refused:
        policy.loads(text, "p.toml")
    assert refused.value.line == line, str(refused.value)
    assert str(refused.value).startswith(f"p.toml:{line}: ")
    assert words in str(refused.value)


def test_an_unreadable_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        policy.load(tmp_path / "missing.toml")


def test_templates_keep_types_interpolate_text_and_refuse_missing_paths() -> None:
    scope = {"args": {"amount": 42, "charge": {"currency": "EUR"}}, "result": {"items": [{"id": "ch_1"}]}}
    assert policy.render("{args.amount}", scope) == 42
    assert policy.render("{args.charge}", scope) == {"currency": "EUR"}
    assert policy.render("{result.items.0.id}", scope) == "ch_1"
    assert policy.render("refund {args.amount} {args.charge.currency} {{literal}}", scope) == (
        "refund 42 EUR {literal}"
    )
    assert policy.render({"a": ["{args.amount}", 3]}, scope) == {"a": [42, 3]}
    with pytest.raises(TemplateError):
        policy.render("{result.items.5.id}", scope)
    with pytest.raises(TemplateError):
        policy.render("{state.x}", scope)


def test_the_observe_skeleton_is_a_valid_policy_where_everything_is_irreversible() -> None:
    text = policy.skeleton("seen", [("b.tool", "Does b"), ("a", ""), ("odd name", "x\ny")])
    loaded = policy.loads(text)
    assert loaded.name == "seen" and loaded.default is None
    assert sorted(r.pattern for r in loaded.rules) == ["a", "b.tool", "odd name"]
    assert {r.semantics.value for r in loaded.rules} == {"IRREVERSIBLE"}
    assert text.count("TODO") == 3
