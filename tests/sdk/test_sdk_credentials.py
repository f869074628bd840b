"""Credential references (`sp.secret("ref")`, sagaplane.credentials): resolved when the call is made,
recorded only as `{"$secret": ref}` (intents, attempts, errors, the abort cause, compensations), a
literal reference in a call's arguments refused, and the resolver the agent configured."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from hypothesis import given
from hypothesis import strategies as st
from sagaplane import credentials
from sagaplane_testkit import read_wal

VALUE = "sk_live_7f3a9c1e5b2d4f60"


@pytest.fixture
def vault() -> Iterator[dict[str, str]]:
    values = {"stripe": VALUE}

    def resolve(ref: str) -> str:
        if ref not in values:
            raise sp.SecretUnresolved(ref, "not in the vault")
        return values[ref]

    credentials.set_resolver(resolve)
    yield values
    credentials.set_resolver(None)


def wal_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.rglob("*") if p.is_file())


@pytest.mark.usefixtures("vault")
def test_the_tool_gets_the_value_and_the_wal_only_the_reference(tmp_path: Path) -> None:
    seen: list[Any] = []

    def charge(amount: int, api_key: str, headers: dict[str, Any]) -> dict[str, Any]:
        seen.append((api_key, headers))
        return {"id": "ch_1"}

    tool = sp.tool(charge, name="pay.charge", semantics=sp.COMPENSABLE, compensate=lambda r: None)
    with sp.WAL(tmp_path / "a.wal", fsync=False) as wal, sp.saga(name="s", wal=wal):
        tool(5, sp.secret("stripe"), headers={"auth": [sp.secret("stripe")]})
    assert seen == [(VALUE, {"auth": [VALUE]})]
    intent = next(r for r in read_wal(tmp_path / "a.wal") if r["event"] == "STEP_INTENT")
    assert intent["kwargs"] == {
        "amount": 5,
        "api_key": {"$secret": "stripe"},
        "headers": {"auth": [{"$secret": "stripe"}]},
    }
    assert VALUE.encode() not in wal_bytes(tmp_path / "a.wal")


@pytest.mark.usefixtures("vault")
def test_errors_that_quote_the_value_are_recorded_with_the_reference(tmp_path: Path) -> None:
    def call(api_key: str) -> None:
        raise PermissionError(f"key {api_key!r} was revoked")

    tool = sp.tool(
        call,
        name="pay.call",
        semantics=sp.REVERSIBLE,
        compensate=lambda r: None,
        retry=sp.Retry(max_attempts=2, sleep=lambda s: None),
    )
    with (
        sp.WAL(tmp_path / "a.wal", fsync=False) as wal,
        pytest.raises(sp.SagaAborted),
        sp.saga(name="s", wal=wal),
    ):
        tool(sp.secret("stripe"))
    records = read_wal(tmp_path / "a.wal")
    assert VALUE.encode() not in wal_bytes(tmp_path / "a.wal")
    cause = next(r for r in records if r["event"] == "SAGA_ABORT_CAUSE")
    assert "<secret:stripe>" in cause["cause"]
    assert "<secret:stripe>" in next(r for r in records if r["event"] == "STEP_ATTEMPT")["error"]


@pytest.mark.usefixtures("vault")
def test_an_unresolvable_reference_is_a_call_not_made(tmp_path: Path) -> None:
    called: list[str] = []
    tool = sp.tool(called.append, name="pay.x", semantics=sp.COMPENSABLE, compensate=lambda r: None)
    with (
        sp.WAL(tmp_path / "a.wal", fsync=False) as wal,
        pytest.raises(sp.SagaAborted) as aborted,
        sp.saga(name="s", wal=wal),
    ):
        tool(sp.secret("nowhere"))
    assert called == [] and isinstance(aborted.value.cause, sp.SecretUnresolved)
    failed = next(r for r in read_wal(tmp_path / "a.wal") if r["event"] == "STEP_FAILED")
    assert "nowhere" in failed["error"]
    assert not aborted.value.report.compensated  # nothing happened: nothing to undo


def test_a_literal_reference_in_arguments_is_refused_before_anything_is_recorded(tmp_path: Path) -> None:
    tool = sp.tool(lambda body: None, name="mail.send", semantics=sp.IRREVERSIBLE, confirm=lambda r: True)
    with (
        sp.WAL(tmp_path / "a.wal", fsync=False) as wal,
        pytest.raises(sp.SagaAborted) as aborted,
        sp.saga(name="s", wal=wal),
    ):
        tool({"$secret": "stripe"})
    assert isinstance(aborted.value.cause, sp.SecretError)
    assert "STEP_INTENT" not in [r["event"] for r in read_wal(tmp_path / "a.wal")]


@pytest.mark.usefixtures("vault")
def test_a_compensation_holds_references_and_resolves_them_when_it_runs(tmp_path: Path) -> None:
    revoked: list[tuple[str, str]] = []
    sp.compensator("cred.revoke")(lambda token, api_key: revoked.append((token, api_key)))
    grant = sp.tool(
        lambda user, api_key: {"token": "t1"},
        name="iam.grant",
        semantics=sp.COMPENSABLE,
        compensate=lambda r, kwargs: sp.undo("cred.revoke", token=r["token"], api_key=kwargs["api_key"]),
    )
    with (
        sp.WAL(tmp_path / "a.wal", fsync=False) as wal,
        pytest.raises(sp.SagaAborted) as aborted,
        sp.saga(name="s", wal=wal),
    ):
        grant("ann", api_key=sp.secret("stripe"))
        raise RuntimeError("undo it")
    assert aborted.value.report.clean and revoked == [("t1", VALUE)]
    committed = next(r for r in read_wal(tmp_path / "a.wal") if r["event"] == "STEP_COMMITTED")
    assert committed["compensation"]["kwargs"] == {"token": "t1", "api_key": {"$secret": "stripe"}}
    assert committed["compensation"]["recoverable"] is True
    assert VALUE.encode() not in wal_bytes(tmp_path / "a.wal")


def test_the_environment_resolver_reads_only_its_prefix() -> None:
    env = sp.EnvSecrets(environ={"SAGAPLANE_SECRET_STRIPE_LIVE": "v1", "HOME": "/root"})
    assert env("stripe.live") == "v1"
    assert env.variable("a-b/c") == "SAGAPLANE_SECRET_A_B_C"
    with pytest.raises(sp.SecretUnresolved, match="SAGAPLANE_SECRET_HOME"):
        env("HOME")


@pytest.mark.usefixtures("vault")
def test_outside_a_saga_the_reference_is_simply_resolved() -> None:
    tool = sp.tool(lambda api_key: api_key, name="plain", semantics=sp.PREVIEW)
    assert tool(sp.secret("stripe")) == VALUE


@pytest.mark.parametrize("bad", ["", "has space", "x" * 201, "-leading"])
def test_a_reference_is_a_name(bad: str) -> None:
    with pytest.raises(sp.SecretError):
        sp.secret(bad)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
WITH_SECRETS = st.recursive(
    JSON | st.builds(sp.secret, st.sampled_from(["stripe", "db.password"])),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(WITH_SECRETS)
def test_recorded_never_holds_a_value_and_resolves_back_to_the_same_call(value: Any) -> None:
    values = {"stripe": VALUE, "db.password": "pw-51c3e9"}
    credentials.set_resolver(values.__getitem__)
    try:
        shown = credentials.recorded(value, markers=True)
        assert VALUE not in repr(shown) and "pw-51c3e9" not in repr(shown)
        assert credentials.Resolved().resolve(shown, markers=True) == credentials.Resolved().resolve(value)
    finally:
        credentials.set_resolver(None)


@given(JSON)
def test_a_value_without_references_is_recorded_as_the_same_object(value: Any) -> None:
    if isinstance(value, dict) and list(value) == ["$secret"]:
        return
    try:
        assert credentials.recorded(value) is value
    except sp.SecretError:
        assert "$secret" in repr(value)
