"""Groups in the approval policy's rule builder (issue 29, item 2): "all of" / "any of" groups of
rows join the rest like one row, so `(a and b) or c` is built without JSON; a policy's predicates
open in the builder exactly as they were (never flattened), or, when rows cannot show them, stay
as they are, read-only beside the rows, with a note and their JSON."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from approvals import predicates as language
from approvals.models import ApprovalPolicy
from core.scoping import tenant_context
from frontend import policy_builder as builder
from tests.support.factories import Person

WORDS = ["usd", "eur", "acme", "wire-1", "Bank"]
A = {"arg": "amount", "op": ">", "value": 1000}
B = {"arg": "currency", "op": "in", "value": ["usd", "eur"]}
C = {"arg": "to", "op": "domain_not_in", "value": ["example.com"]}


def _comparison() -> st.SearchStrategy[dict[str, Any]]:
    arg = st.sampled_from(["amount", "currency", "to", "desk"])
    number = st.integers(min_value=-(10**12), max_value=10**12)
    scalar = st.one_of(number, st.sampled_from(WORDS), st.booleans())
    domains = st.lists(
        st.sampled_from(["example.com", "corp.example", "pay.acme.io"]), min_size=1, max_size=3
    )
    return st.one_of(
        st.builds(
            lambda a, op, v: {"arg": a, "op": op, "value": v},
            arg,
            st.sampled_from([">", ">=", "<", "<="]),
            number,
        ),
        st.builds(
            lambda a, op, v: {"arg": a, "op": op, "value": v}, arg, st.sampled_from(["==", "!="]), scalar
        ),
        st.builds(
            lambda a, op, v: {"arg": a, "op": op, "value": v},
            arg,
            st.sampled_from(["in", "not_in"]),
            st.lists(scalar, min_size=1, max_size=3),
        ),
        st.builds(
            lambda a, op, v: {"arg": a, "op": op, "value": v},
            arg,
            st.sampled_from(["domain_in", "domain_not_in"]),
            domains,
        ),
    )


def _group(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda kind, items: {kind: items},
        st.sampled_from(["any", "all"]),
        st.lists(inner, min_size=1, max_size=3),
    )


# Any list of the language, groups nested as deep as it allows (two).
PREDICATES = st.lists(
    st.one_of(_comparison(), _group(st.one_of(_comparison(), _group(_comparison())))), max_size=4
)


def _rows_back(predicates: list[Any]) -> builder.Builder:
    return builder.stored(predicates, [], {})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PREDICATES)
def test_a_policy_opens_as_it_was_or_is_kept_whole(predicates: list[Any]) -> None:
    predicates = language.validate(predicates)
    rows = _rows_back(predicates)
    if rows.kept is not None:
        assert rows.kept == predicates and rows.conditions == []
    else:
        assert builder.predicates_of(builder.shown(rows)) == predicates  # a blank row to fill changes nothing
    assert language.validate(builder.predicates_of(rows)) == predicates


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_comparison(), _group(_comparison())), max_size=4), st.booleans())
def test_one_level_of_groups_always_opens_in_the_rows(items: list[Any], any_of: bool) -> None:
    predicates = language.validate([{"any": items}] if any_of and len(items) >= 2 else items)
    rows = _rows_back(predicates)
    assert rows.kept is None
    assert builder.predicates_of(rows) == predicates


def test_a_or_b_and_c_is_a_group_and_a_row_joined_by_or() -> None:
    form = {
        "conditions": "3",
        "c0_arg": "amount",
        "c0_op": ">",
        "c0_value": "1,000",
        "c0_group": "0",
        "c1_arg": "currency",
        "c1_op": "in",
        "c1_value": "usd, eur",
        "c1_group": "0",
        "c1_join": "or",  # a row inside a group has its group's join: ignored
        "g0_mode": "all",
        "c2_arg": "to",
        "c2_op": "domain_not_in",
        "c2_value": "example.com",
        "c2_join": "or",
    }
    predicates = builder.predicates_of(builder.posted(_multi(form)))
    assert predicates == [{"any": [{"all": [A, B]}, C]}]
    assert builder.sentence(predicates) == (
        "((amount is more than 1000 and currency is one of usd, eur) or to has a domain outside example.com)"
    )
    assert language.matches(predicates, {"amount": 5, "currency": "gbp", "to": "a@example.com"}) is False
    assert language.matches(predicates, {"amount": 5000, "currency": "usd", "to": "a@example.com"}) is True
    assert language.matches(predicates, {"amount": 5, "currency": "gbp", "to": "a@elsewhere.org"}) is True


def test_adding_and_removing_rows_keeps_each_group_and_its_join() -> None:
    rows = _rows_back([A, {"any": [{"any": [B, C]}, A]}])
    assert [(r["group"], r["join"]) for r in rows.conditions] == [
        (None, "and"),
        (0, "and"),
        (0, "and"),
        (None, "or"),
    ]
    grown = builder.shown(rows, "add-to-group-0")
    assert [r["group"] for r in grown.conditions] == [None, 0, 0, 0, None]
    assert builder.predicates_of(grown) == builder.predicates_of(rows)  # a blank row adds nothing
    rows.conditions[1]["join"] = "or"  # the group joins the row above by "or"
    removed = builder.shown(rows, "remove-condition-1")
    assert builder.predicates_of(removed) == [{"any": [A, {"any": [C]}, A]}]
    added = builder.shown(builder.Builder(), "add-group")
    assert [(r["group"], r["arg"]) for r in added.conditions] == [(0, "")] and added.modes == {0: "all"}
    assert builder.predicates_of(added) == []


@pytest.mark.parametrize(
    "predicates",
    [
        [{"any": [{"all": [A, B]}]}],  # a group in a group of one
        [{"all": [A, {"any": [B, C]}]}],  # a group in an "all" group
        [B, {"any": [{"any": [A, C]}]}],  # the same with "any"
    ],
)
def test_what_rows_cannot_show_is_kept_whole(predicates: list[Any]) -> None:
    assert language.validate(predicates) == predicates
    rows = _rows_back(predicates)
    assert rows.kept == predicates and rows.conditions == []


def _multi(form: dict[str, Any]) -> Any:
    from django.http import QueryDict

    data = QueryDict(mutable=True)
    for key, value in form.items():
        data.setlist(key, value if isinstance(value, list) else [value])
    return data


class _Fields(HTMLParser):
    """The policy form's fields as a browser would post them (selected options, checked boxes)."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: list[tuple[str, str]] = []
        self._select: str | None = None
        self._first: str | None = None
        self._chosen = False
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and a.get("id") == "policy-form":
            self._inside = True
        if not self._inside:
            return
        if tag == "input" and a.get("name") and a.get("type") != "checkbox":
            self.fields.append((a["name"], a.get("value", "")))
        elif tag == "input" and a.get("type") == "checkbox" and "checked" in a:
            self.fields.append((a["name"], a.get("value", "on")))
        elif tag == "select":
            self._select, self._first, self._chosen = a.get("name"), None, False
        elif tag == "option" and self._select:
            if self._first is None:
                self._first = a.get("value", "")
            if "selected" in a:
                self.fields.append((self._select, a.get("value", "")))
                self._chosen = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "select" and self._select:
            if not self._chosen and self._first is not None:
                self.fields.append((self._select, self._first))
            self._select = None
        if tag == "form":
            self._inside = False


def _posted_back(html: str) -> dict[str, list[str]]:
    parser = _Fields()
    parser.feed(html)
    form: dict[str, list[str]] = {}
    for name, value in parser.fields:
        if name != "csrfmiddlewaretoken":
            form.setdefault(name, []).append(value)
    return form


@pytest.mark.django_db
def test_a_nested_policy_saved_unchanged_from_its_form_keeps_its_predicates(alice: Person) -> None:
    nested = [A, {"any": [{"all": [B, C]}, {"arg": "desk", "op": "==", "value": "acme"}]}]
    created = alice.session_client().post(
        "/api/v1/approvals/policies",
        {"name": "nested", "tool": "bank.*", "predicates": nested, "eligible_roles": ["owner"]},
        format="json",
    )
    assert created.status_code == 201, created.json()
    client = Client()
    client.force_login(alice.user)
    page = client.get(f"/approvals/policies/{created.json()['id']}/edit").content.decode()
    assert 'id="kept-predicates"' not in page and page.count('class="builder-group"') == 1
    assert re.search(r'<option value="all" selected>all of these hold</option>', page)
    form = _posted_back(page)
    assert form["c1_group"] == ["0"] and form["c3_join"] == ["or"]
    saved = client.post(f"/approvals/policies/{created.json()['id']}/edit", form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    with tenant_context(alice.tenant):
        assert ApprovalPolicy.objects.get(name="nested").predicates == nested


@pytest.mark.django_db
def test_a_policy_rows_cannot_show_is_read_only_json_with_a_note_and_kept(alice: Person) -> None:
    deep = [{"all": [A, {"any": [B, C]}]}]
    created = alice.session_client().post(
        "/api/v1/approvals/policies",
        {"name": "deep", "tool": "bank.*", "predicates": deep, "eligible_roles": ["owner"]},
        format="json",
    )
    assert created.status_code == 201, created.json()
    client = Client()
    client.force_login(alice.user)
    page = client.get(f"/approvals/policies/{created.json()['id']}/edit").content.decode()
    assert 'id="kept-predicates"' in page and "to change them, use the API" in page
    assert "&quot;all&quot;" in page  # the JSON, read-only (no field carries it)
    form = _posted_back(page)
    assert not any("all" in v for values in form.values() for v in values if v.startswith("["))
    form["required_approvals"] = ["2"]
    assert client.post(f"/approvals/policies/{created.json()['id']}/edit", form).status_code == 302
    with tenant_context(alice.tenant):
        policy = ApprovalPolicy.objects.get(name="deep")
    assert policy.predicates == deep and policy.required_approvals == 2
