"""audit.hooks: how the evidence store tells the apps above it what was appended, without
importing them (the saga projection and the transparency log subscribe in AppConfig.ready)."""

from __future__ import annotations

import contextvars
from typing import Any

import pytest

from audit import hooks, services
from audit.models import Record
from core.scoping import tenant_context
from sagas import services as sagas_services
from tenants.actors import named_actor
from tests.support.chains import chain, saga_records, snapshot
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from transparency import hooks as transparency_hooks

marker: contextvars.ContextVar[str] = contextvars.ContextVar("test_hooks_marker", default="unset")


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test adds to copies of the registry: the apps' own subscriptions stay as they were."""
    for name in ("_in_transaction", "_committed", "_erased"):
        monkeypatch.setattr(hooks, name, list(getattr(hooks, name)))


def test_the_apps_subscribe_in_ready() -> None:
    assert sagas_services.project_appended in hooks._in_transaction
    assert sagas_services.rebuild_after_erasure in hooks._erased
    assert transparency_hooks.records_committed in hooks._committed


def test_an_in_transaction_hook_sees_the_batch_then_its_leaf_indices(alice: Person) -> None:
    seen: list[Any] = []

    def hook(appended: hooks.AppendedRecords) -> hooks.OnStored:
        seen.append(("before", appended.stream_id, [row.seq for row, _ in appended.items]))

        def stored(base: int) -> None:
            seen.append(("stored", base, [row.leaf_index for row, _ in appended.items]))

        return stored

    hooks.on_records_appended(hook)
    records = chain(saga_records(steps=1))
    in_tenant(services.ingest, alice.tenant, "agent-hooks", records, actor=named_actor("test"))
    with tenant_context(alice.tenant):
        leaves = list(
            Record.objects.filter(stream__stream_id="agent-hooks")
            .order_by("position")
            .values_list("leaf_index", flat=True)
        )
    assert seen == [
        ("before", "agent-hooks", [r["seq"] for r in records]),
        ("stored", leaves[0], leaves),
    ]


def test_an_in_transaction_hook_that_fails_rolls_the_batch_back(alice: Person) -> None:
    def hook(appended: hooks.AppendedRecords) -> hooks.OnStored:
        def stored(base: int) -> None:
            raise RuntimeError("the subscriber cannot keep up")

        return stored

    hooks.on_records_appended(hook)
    before = snapshot(alice.tenant)
    with pytest.raises(RuntimeError):
        in_tenant(
            services.ingest,
            alice.tenant,
            "agent-hooks",
            chain(saga_records(steps=1)),
            actor=named_actor("test"),
        )
    assert snapshot(alice.tenant) == before


def test_after_commit_hooks_wait_for_the_commit_and_see_the_append_context(
    alice: Person, django_capture_on_commit_callbacks: Any
) -> None:
    heard: list[tuple[str, str]] = []
    hooks.after_records_committed(lambda appended: heard.append((appended.stream_id, marker.get())))
    token = marker.set("appending")
    try:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            in_tenant(
                services.ingest,
                alice.tenant,
                "agent-hooks",
                chain(saga_records(steps=1)),
                actor=named_actor("test"),
            )
    finally:
        marker.reset(token)
    assert heard == []  # nothing inside the transaction
    for callback in callbacks:
        callback()
    assert heard == [("agent-hooks", "appending")]  # the context of the append, not of the commit


def test_a_failing_after_commit_hook_changes_no_answer(
    alice: Person, django_capture_on_commit_callbacks: Any
) -> None:
    heard: list[str] = []

    def failing(appended: hooks.AppendedRecords) -> None:
        raise RuntimeError("broker down")

    hooks.after_records_committed(failing)
    hooks.after_records_committed(lambda appended: heard.append(appended.stream_id))
    records = chain(saga_records(steps=1))
    with django_capture_on_commit_callbacks(execute=True):
        result = in_tenant(services.ingest, alice.tenant, "agent-hooks", records, actor=named_actor("test"))
    assert result.accepted == len(records)
    assert heard == ["agent-hooks"]  # the next hook still ran


def test_registering_twice_registers_once() -> None:
    def hook(appended: hooks.AppendedRecords) -> None:
        return None

    hooks.after_records_committed(hook)
    hooks.after_records_committed(hook)
    assert hooks._committed.count(hook) == 1
