"""Self-healing seals: a crash between integrating and sealing no longer leaves a finished saga
unsealed until its next record; the beat's seal pass, driven by a per-tenant watermark, seals it."""

from __future__ import annotations

from typing import Any

import pytest

from audit import services as audit_services
from core.scoping import tenant_context
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.chains import Writer
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.transparency import seal_records, seal_watermark
from transparency import services, sources
from transparency.models import TreeState
from transparency.tasks import integrate_fully, integrate_grown_tenants, seal_pending

API = "/api/v1/audit"


class Crash(BaseException):
    """Stands in for the process dying (not an Exception, so nothing catches it)."""


def _state(tenant: Tenant) -> TreeState:
    with tenant_context(tenant):
        return TreeState.objects.get()


def test_integrated_but_never_sealed_is_sealed_by_the_beat(
    tenant_a: Tenant, alice: Person, writer_a: Writer
) -> None:
    writer_a.saga("done")
    writer_a.saga("open", end=None)
    # The integrator signed, then died before its seal step: this is all that ran.
    integrate_fully(tenant_a)
    assert seal_records(tenant_a) == []
    assert tenant_a.pk not in services.tenants_to_integrate()  # nothing left to integrate...
    assert tenant_a.pk in services.tenants_to_seal()  # ...but the seal watermark lags
    assert alice.key_client().get(f"{API}/sagas/done/disclosure").json()["error"] == "not_sealed"

    assert tenant_a.pk in integrate_grown_tenants()  # the 1 s beat

    assert [saga for saga, _ in seal_records(tenant_a)] == ["done"]  # the open saga is not sealed
    assert seal_watermark(tenant_a) == _state(tenant_a).size  # the seal itself integrated, signed, looked at
    assert services.tenants_to_seal() == [] and services.tenants_to_integrate() == []
    response = alice.key_client().get(f"{API}/sagas/done/disclosure")
    assert response.status_code == 200, response.content
    assert len(response.json()["records"]) == 6
    # Running the beat again changes nothing: the latest seal is current.
    integrate_grown_tenants()
    assert len(seal_records(tenant_a)) == 1


def test_a_crash_mid_seal_pass_rolls_back_and_is_redone(
    tenant_a: Tenant, writer_a: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer_a.saga("one")
    writer_a.saga("two")
    integrate_fully(tenant_a)
    before = seal_watermark(tenant_a)
    real_append = sources.append_server_records
    appended: list[str] = []

    def append_then_die(tenant: Tenant, entries: list[tuple[str, dict[str, Any]]], *, actor: str) -> None:
        real_append(tenant, entries, actor=actor)
        appended.extend(fields["saga_id"] for _, fields in entries)
        raise Crash  # after both seals are appended, before the watermark moves and commits

    monkeypatch.setattr(sources, "append_server_records", append_then_die)
    with pytest.raises(Crash):
        seal_pending(tenant_a)
    monkeypatch.undo()
    assert appended == ["one", "two"]  # one batch: the pass appends every seal it needs at once
    # One transaction: neither seal nor the watermark survived the crash.
    assert seal_records(tenant_a) == []
    assert seal_watermark(tenant_a) == before

    integrate_grown_tenants()
    assert sorted(saga for saga, _ in seal_records(tenant_a)) == ["one", "two"]


def test_the_pass_only_reads_leaves_past_the_watermark(
    tenant_a: Tenant, writer_a: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer_a.saga("early")
    integrate_grown_tenants()
    sealed_to = seal_watermark(tenant_a)
    writer_a.saga("late")
    integrate_fully(tenant_a)
    real = sources.terminal_sagas_touched
    ranges: list[tuple[int, int]] = []

    def spy(tenant: Tenant, start: int, end: int) -> dict[str, sources.Span]:
        ranges.append((start, end))
        return real(tenant, start, end)

    monkeypatch.setattr(sources, "terminal_sagas_touched", spy)
    sealed = seal_pending(tenant_a, max_leaves=4)
    assert sealed == ["late"]
    # Bounded chunks starting at the watermark; nothing before it is looked at again.
    assert ranges[0][0] == sealed_to and all(end - start <= 4 for start, end in ranges)
    assert [s for s, _ in ranges[1:]] == [e for _, e in ranges[:-1]]  # contiguous


def test_a_record_after_the_seal_gets_a_fresh_seal(tenant_a: Tenant, writer_a: Writer) -> None:
    writer_a.saga("pay")
    integrate_grown_tenants()
    first = seal_records(tenant_a)
    assert [s for s, _ in first] == ["pay"]
    # A server record about the finished saga (as an approval or recovery note would be).
    in_tenant(
        audit_services.append_server_record,
        tenant_a,
        "SAGA_NOTE",
        {"saga_id": "pay"},
        actor=named_actor("test"),
    )
    integrate_fully(tenant_a)  # integrated; sealing "crashed" again
    assert seal_records(tenant_a) == first
    integrate_grown_tenants()
    seals = seal_records(tenant_a)
    assert len(seals) == 2 and seals[-1][1] > first[0][1]


def test_other_tenants_are_healed_independently(
    tenant_a: Tenant, tenant_b: Tenant, writer_a: Writer, writer_b: Writer
) -> None:
    writer_a.saga("a1")
    writer_b.saga("b1")
    integrate_fully(tenant_a)
    integrate_fully(tenant_b)
    assert {tenant_a.pk, tenant_b.pk} <= set(services.tenants_to_seal())
    seal_pending(tenant_b)
    assert [s for s, _ in seal_records(tenant_b)] == ["b1"]
    assert seal_records(tenant_a) == []  # b's pass touched nothing of a
    integrate_grown_tenants()
    assert [s for s, _ in seal_records(tenant_a)] == ["a1"]
