"""The policy predicate language: validated data, never code; when in doubt a call needs approval."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from approvals.predicates import InvalidPredicate, matches, validate

BIG = [{"arg": "amount", "op": ">", "value": 10000}]
CURRENCY = [{"arg": "currency", "op": "in", "value": ["USD", "EUR"]}]
OUTSIDE = [{"arg": "to", "op": "domain_not_in", "value": ["acme.example", "Partner.example"]}]


@pytest.mark.parametrize(
    ("predicates", "args", "needs_approval"),
    [
        (BIG, {"amount": 10001}, True),
        (BIG, {"amount": 10000}, False),
        (BIG, {"amount": 100.5}, False),
        (BIG, {"amount": "99999999"}, True),  # an amount sent as text is not let through
        (BIG, {"amount": float("nan")}, True),
        (BIG, {"amount": True}, True),
        (BIG, {}, True),  # missing: ask
        (CURRENCY, {"currency": "USD"}, True),
        (CURRENCY, {"currency": "GBP"}, False),
        (OUTSIDE, {"to": "cfo@acme.example"}, False),
        (OUTSIDE, {"to": "x@pay.partner.example"}, False),
        (OUTSIDE, {"to": "mallory@evil.example"}, True),
        (OUTSIDE, {"to": "mallory@acme.example.evil.example"}, True),
        (OUTSIDE, {"to": ["cfo@acme.example", "m@evil.example"]}, True),
        (OUTSIDE, {"to": "https://evil.example/x"}, True),
        (OUTSIDE, {"to": "not an address"}, True),
        (OUTSIDE, {"to": 42}, True),
        ([{"any": [*BIG, *OUTSIDE]}], {"amount": 5, "to": "a@acme.example"}, False),
        ([{"any": [*BIG, *OUTSIDE]}], {"amount": 5, "to": "a@evil.example"}, True),
        ([*BIG, *CURRENCY], {"amount": 20000, "currency": "GBP"}, False),
        # (big and in USD/EUR) or outside: an "all" group inside an "any" one.
        (
            [{"any": [{"all": [*BIG, *CURRENCY]}, *OUTSIDE]}],
            {"amount": 20000, "currency": "GBP", "to": "a@acme.example"},
            False,
        ),
        (
            [{"any": [{"all": [*BIG, *CURRENCY]}, *OUTSIDE]}],
            {"amount": 20000, "currency": "USD", "to": "a@acme.example"},
            True,
        ),
        (
            [{"any": [{"all": [*BIG, *CURRENCY]}, *OUTSIDE]}],
            {"amount": 5, "currency": "GBP", "to": "a@evil.example"},
            True,
        ),
        ([], {"anything": 1}, True),
    ],
)
def test_predicates(predicates: list[dict[str, Any]], args: dict[str, Any], needs_approval: bool) -> None:
    assert matches(validate(predicates), args) is needs_approval


@pytest.mark.parametrize(
    "bad",
    [
        "amount > 10000",  # text is not the language: nothing is ever evaluated
        [{"arg": "amount", "op": "__import__", "value": 1}],
        [{"arg": "amount", "op": ">", "value": "10000"}],
        [{"arg": "amount", "op": ">", "value": float("inf")}],
        [{"arg": "", "op": ">", "value": 1}],
        [{"arg": "a", "op": "in", "value": "USD"}],
        [{"arg": "a", "op": "in", "value": [{"x": 1}]}],
        [{"arg": "to", "op": "domain_not_in", "value": ["not a domain"]}],
        [{"arg": "to", "op": "domain_not_in", "value": []}],
        [{"arg": "a", "op": ">", "value": 1, "extra": 1}],
        [{"any": []}],
        [{"any": [{"any": [{"any": BIG}]}]}],
        [{"any": [{"all": [{"any": BIG}]}]}],
        [{"all": []}],
        [{"all": BIG, "any": BIG}],
        [{"every": BIG}],
        [BIG[0]] * 21,
    ],
)
def test_anything_else_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidPredicate):
        validate(bad)


@given(
    st.dictionaries(
        st.text(max_size=5), st.recursive(st.none() | st.booleans() | st.floats() | st.text(), st.lists)
    )
)
def test_any_arguments_are_answered_without_error(args: dict[str, Any]) -> None:
    for predicates in (BIG, CURRENCY, OUTSIDE):
        assert matches(validate(predicates), {**args}) in (True, False)
