"""The sealer runs beside the integrator, not inside it (issue 16): seal passes serialise on the
SealState row, the integrator on TreeState's, so neither waits for the other's lock; the seals are
leaves the integrator signs later; `seal_tenant` is coalesced like `integrate_tenant`; a crash
between sealing and signing is healed by the beat."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction

from audit.models import TenantLog
from core.scoping import tenant_context
from tenants.models import Tenant
from tests.support.chains import Writer
from tests.support.concurrency import at_once
from tests.support.scoping import in_tenant
from tests.support.transparency import seal_records, seal_watermark, settle
from transparency import services, tasks
from transparency.actions import integration, seals
from transparency.models import Checkpoint
from transparency.tasks import integrate_fully, seal_pending

PATIENCE_S = 60.0  # a hang guard only: every wait below is released by the test itself


def _log_size(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return TenantLog.objects.get().size


def _signed_size(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return Checkpoint.objects.order_by("-id").values_list("size", flat=True).first() or 0


@contextmanager
def _held(lock: Callable[[Tenant], Any], tenant: Tenant) -> Iterator[None]:
    """`lock(tenant)` taken in another thread's transaction (its own connection) and held until
    the block ends."""
    taken, release = threading.Event(), threading.Event()
    outcome: list[BaseException | bool] = []

    def hold() -> None:
        try:
            with tenant_context(tenant), transaction.atomic():
                lock(tenant)
                taken.set()
                outcome.append(release.wait(PATIENCE_S))  # False: the block never ended in time
        except BaseException as exc:
            outcome.append(exc)
        finally:
            taken.set()
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(PATIENCE_S)
        assert not outcome, outcome  # the lock is held, not failed
        yield
    finally:
        release.set()
        holder.join(PATIENCE_S)
    assert outcome == [True]  # held throughout the block, released by it


@contextmanager
def _lock_timeout(value: str) -> Iterator[None]:
    """Waiting for a row lock longer than `value` fails this connection's statement: a pass that
    waited for the held lock fails the test instead of hanging it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, false)", [value])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', '0', false)")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_seal_pass_completes_while_the_integrator_holds_its_lock(
    tenant_a: Tenant, writer_a: Writer
) -> None:
    settle(tenant_a)
    signed_before = _signed_size(tenant_a)
    writer_a.saga("one")
    writer_a.saga("two")
    writer_a.saga("open", end=None)

    with _held(integration.locked_state, tenant_a):  # the integrator, mid-round
        # The control: the integrator's own lock is taken, another integration would wait for it.
        with _lock_timeout("50ms"), pytest.raises(OperationalError, match="lock timeout"):
            in_tenant(services.integrate, tenant_a)
        with _lock_timeout("20s"):
            sealed, sealed_up = in_tenant(services.seal_pass, tenant_a)  # does not wait for it
        assert sorted(sealed) == ["one", "two"] and sealed_up
        assert _signed_size(tenant_a) == signed_before  # nothing signed meanwhile

    # The watermark moved once, over the records and the seals (they landed right at it).
    assert seal_watermark(tenant_a) == _log_size(tenant_a)
    assert in_tenant(services.seal_pass, tenant_a) == ([], True)
    # The integrator signs the seals later, in its own pass.
    assert tenant_a.pk in services.tenants_to_integrate()
    integrate_fully(tenant_a)
    seals = seal_records(tenant_a)
    assert sorted(saga for saga, _ in seals) == ["one", "two"]  # each once
    assert _signed_size(tenant_a) == _log_size(tenant_a) > max(leaf for _, leaf in seals)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_integration_completes_while_a_seal_pass_holds_its_lock(
    tenant_a: Tenant, writer_a: Writer
) -> None:
    settle(tenant_a)
    writer_a.saga("one")
    with _held(seals._locked_seal_state, tenant_a):  # the sealer, mid-pass
        with _lock_timeout("50ms"), pytest.raises(OperationalError, match="lock timeout"):
            in_tenant(services.seal_pass, tenant_a)  # the control: another seal pass would wait
        with _lock_timeout("20s"):
            checkpoint = in_tenant(services.integrate, tenant_a)  # does not wait for it
        assert checkpoint is not None and checkpoint.size == _log_size(tenant_a)
    assert seal_records(tenant_a) == []  # the records are signed, their seal is the sealer's to do
    settle(tenant_a)
    assert [saga for saga, _ in seal_records(tenant_a)] == ["one"]
    assert _signed_size(tenant_a) == _log_size(tenant_a)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_sealing_and_integrating_at_once_seal_every_saga_once_and_sign_everything(
    tenant_a: Tenant, writer_a: Writer
) -> None:
    settle(tenant_a)
    for n in range(5):
        writer_a.saga(f"s{n}")
    outcomes = at_once(lambda work: work(tenant_a), [seal_pending, integrate_fully, seal_pending])
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    integrate_fully(tenant_a)  # whatever the seals added after the integrator's read
    assert sorted(saga for saga, _ in seal_records(tenant_a)) == [f"s{n}" for n in range(5)]
    assert seal_watermark(tenant_a) == _log_size(tenant_a) == _signed_size(tenant_a)


def test_the_seal_task_coalesces_a_call_finding_it_running_leaves_its_request(
    tenant_a: Tenant, writer_a: Writer
) -> None:
    from django.core.cache import cache

    settle(tenant_a)
    writer_a.saga("waiting")
    assert tasks._claim(tenant_a, "someone-else", tasks.SEAL)
    try:
        cache.set(tasks._request_key(tenant_a.pk, tasks.SEAL), "1")
        assert tasks.seal_tenant(tenant_a.pk) == 0  # nothing sealed, nothing blocked
        assert seal_records(tenant_a) == []
        assert tasks._requested(tenant_a.pk, tasks.SEAL)  # the running sealer's to take
        # The integrator's claim is its own: integration is not held up by the sealer.
        assert tasks.integrate_tenant(tenant_a.pk) == _log_size(tenant_a)
    finally:
        tasks._release(tenant_a, "someone-else", tasks.SEAL)
    assert tasks.seal_tenant(tenant_a.pk) == 1
    assert not tasks._requested(tenant_a.pk, tasks.SEAL)


def test_two_seal_calls_one_runs_and_takes_the_others_work(
    tenant_a: Tenant,
    writer_a: Writer,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from controlplane.celery import app

    settle(tenant_a)
    writer_a.saga("first")
    passes: list[list[str]] = []
    inner: list[int] = []
    real = services.seal_pass

    def pass_while_a_batch_arrives(tenant: Tenant, **kwargs: Any) -> tuple[list[str], bool]:
        outcome = real(tenant, **kwargs)
        passes.append(outcome[0])
        if len(passes) == 1:
            # A batch commits mid-pass (from another client: not in the sealer's context, whose
            # own appends request nothing): its hook requests sealing, and the task (run at once
            # here) finds this sealer's claim and returns, sealing nothing.
            def another_client() -> None:
                with django_capture_on_commit_callbacks(execute=True):
                    writer_a.saga("second")

            contextvars.Context().run(another_client)
            inner.append(len(seal_records(tenant)))
        return outcome

    monkeypatch.setattr(services, "seal_pass", pass_while_a_batch_arrives)
    monkeypatch.setitem(app.conf, "task_always_eager", True)
    appended = tasks.seal_tenant(tenant_a.pk)
    assert passes[0] == ["first"] and inner == [1]  # the second call sealed nothing
    assert passes[1] == ["second"] and appended == 2  # the running sealer took its request
    assert not tasks._requested(tenant_a.pk, tasks.SEAL)


def test_a_crash_between_seal_and_sign_is_healed_by_the_beat(
    tenant_a: Tenant, writer_a: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settle(tenant_a)
    writer_a.saga("pay")

    def broker_down(tenant_id: int) -> bool:
        raise ConnectionError("broker unreachable")

    # The seals commit, then their signing cannot be requested (the process could as well die).
    monkeypatch.setattr(tasks, "request_integration", broker_down)
    assert tasks.seal_tenant(tenant_a.pk) == 1
    monkeypatch.undo()
    (seal,) = seal_records(tenant_a)
    assert _signed_size(tenant_a) <= seal[1]  # the seal is not signed
    assert tenant_a.pk in services.tenants_to_integrate()
    assert tenant_a.pk not in services.tenants_to_seal()

    assert tenant_a.pk in tasks.integrate_grown_tenants()  # the 1 s beat
    assert _signed_size(tenant_a) == _log_size(tenant_a) > seal[1]
    assert seal_records(tenant_a) == [seal]  # signed, not sealed again
