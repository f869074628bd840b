"""Two owners demoting (or removing) each other at the same moment must not leave the tenant
with no owner: one change wins, the other is refused with `last_owner`.

Two real threads on two Postgres connections. The race is forced, not hoped for: the first
thread to pass the "another owner remains" check is held right after it, with its transaction
open, until the second thread has either passed the same check too (the defect: both then commit
and no owner is left) or is waiting on a row lock in Postgres (the fix: it re-checks once the
first commits)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from audit.models import Record
from core.errors import DomainError
from core.scoping import tenant_context
from tenants import founding, services
from tenants.actors import named_actor, user_actor
from tenants.models import Membership, Role, Tenant
from tests.support.scoping import in_tenant
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

DEADLINE_S = 60.0


def _waiting_on_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


def _demote(target: Membership) -> None:
    with tenant_context(target.tenant):
        services.change_member_role(target, Role.VIEWER, actor=user_actor("race"))


def _remove(target: Membership) -> None:
    with tenant_context(target.tenant):
        services.remove_member(target, actor=user_actor("race"))


@pytest.mark.parametrize(
    ("first_action", "second_action"),
    [(_demote, _demote), (_remove, _remove), (_demote, _remove)],
    ids=["both-demote", "both-remove", "demote-and-remove"],
)
def test_two_owners_acting_on_each_other_leave_one_owner(
    monkeypatch: pytest.MonkeyPatch,
    first_action: Callable[[Membership], None],
    second_action: Callable[[Membership], None],
) -> None:
    tenant = founding.create_tenant(
        "race", "Race Co", "ann@race.example", "pw-ann-123456", actor=named_actor("test")
    )
    in_tenant(
        services.add_member,
        tenant,
        "ben@race.example",
        Role.OWNER,
        "pw-ben-123456",
        actor=named_actor("test"),
    )
    users = get_user_model().objects
    with tenant_context(tenant):
        ann = Membership.objects.get(user=users.get(email="ann@race.example"))
        ben = Membership.objects.get(user=users.get(email="ben@race.example"))
        records_before = Record.objects.filter(stream__stream_id="server").count()

    real_check = services._other_owners
    start = threading.Barrier(2)
    lock = threading.Lock()
    passed_check: list[str] = []
    first_passed = threading.Event()
    release_first = threading.Event()
    pids: dict[str, int] = {}
    outcomes: dict[str, Any] = {}

    def held_check(membership: Membership) -> bool:
        result = real_check(membership)
        with lock:
            passed_check.append(threading.current_thread().name)
            first = len(passed_check) == 1
        if first:
            first_passed.set()
            assert release_first.wait(DEADLINE_S), "the first change was never released"
        return result

    monkeypatch.setattr(services, "_other_owners", held_check)

    def run(name: str, action: Callable[[Membership], None], target: Membership) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pids[name] = cursor.fetchone()[0]
            start.wait(DEADLINE_S)
            action(target)
            outcomes[name] = "ok"
        except DomainError as exc:
            outcomes[name] = exc.code
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcomes[name] = repr(exc)
        finally:
            connection.close()

    threads = {
        "ann-acts": threading.Thread(target=run, name="ann-acts", args=("ann-acts", first_action, ben)),
        "ben-acts": threading.Thread(target=run, name="ben-acts", args=("ben-acts", second_action, ann)),
    }
    for thread in threads.values():
        thread.start()
    try:
        wait_until(first_passed.is_set, "one change passed the owner check", deadline=DEADLINE_S, every=0.005)
        first = passed_check[0]
        other = next(name for name in threads if name != first)
        wait_until(
            lambda: other in passed_check or not threads[other].is_alive() or _waiting_on_a_lock(pids[other]),
            "the other change passed the check too, or waits on a lock",
            deadline=DEADLINE_S,
            every=0.005,
        )
    finally:
        release_first.set()
        for thread in threads.values():
            thread.join(DEADLINE_S)

    assert sorted(outcomes.values()) == ["last_owner", "ok"], outcomes
    assert outcomes[first] == "ok"
    with tenant_context(Tenant.objects.get(slug="race")):
        assert Membership.objects.filter(role=Role.OWNER).count() == 1
        # Only the change that happened is in the audit stream.
        assert Record.objects.filter(stream__stream_id="server").count() == records_before + 1
