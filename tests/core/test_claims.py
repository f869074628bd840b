"""The one leased-work claim (core/claims.py), on whichever database the suite runs (Postgres and
SQLite both run it): due rows are taken in the candidates' order under a raised fencing token,
a held row is not taken again until its lease lapses, and an old token no longer holds."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db.models import Q, QuerySet
from django.utils import timezone

from core.claims import Increment, Leased, SetIfNull, claim
from core.scoping import tenant_context
from reconciliation.models import CheckStatus, ReconciliationCheck
from tenants.models import Tenant

pytestmark = pytest.mark.django_db

CHECKS = Leased(
    ReconciliationCheck,
    state="status",
    claimed=CheckStatus.CLAIMED,
    claimable=(CheckStatus.PENDING, CheckStatus.CLAIMED),
    token="token",
    holder="claimed_by",
    lease="lease_expires_at",
)


def _due(now: datetime) -> QuerySet[ReconciliationCheck]:
    due = Q(status=CheckStatus.PENDING) | Q(status=CheckStatus.CLAIMED, lease_expires_at__lte=now)
    return ReconciliationCheck.objects.filter(due, not_before__lte=now).order_by("not_before")


def _checks(tenant: Tenant, count: int, now: datetime) -> list[ReconciliationCheck]:
    return [
        ReconciliationCheck.objects.create(
            saga_id=f"s{i}",
            step_id="a",
            handler="shop.refund",
            compensated_leaf=i,
            compensated_in="server",
            not_before=now - timedelta(seconds=count - i),
            deadline=now + timedelta(hours=1),
        )
        for i in range(count)
    ]


def test_a_claim_takes_due_rows_in_order_under_a_new_token(tenant_a: Tenant) -> None:
    now = timezone.now()
    with tenant_context(tenant_a):
        made = _checks(tenant_a, 3, now)
        taken = claim(
            CHECKS, _due, now=now, holder="w1", lease_until=now + timedelta(seconds=30), limit=2, shape="t"
        )
        assert [c.pk for c in taken] == [made[0].pk, made[1].pk]
        assert [(c.status, c.token, c.claimed_by) for c in taken] == [(CheckStatus.CLAIMED, 1, "w1")] * 2
        assert all(CHECKS.holds(c, 1) and not CHECKS.holds(c, 0) for c in taken)
        # Held: the next claim (same shape, later moment) takes only the one left.
        later = now + timedelta(seconds=1)
        rest = claim(
            CHECKS,
            _due,
            now=later,
            holder="w2",
            lease_until=later + timedelta(seconds=30),
            limit=5,
            shape="t",
        )
        assert [c.pk for c in rest] == [made[2].pk]
        # The lease lapsed: claimed again under the next token; the old one holds no more.
        lapsed = now + timedelta(seconds=31)
        again = claim(
            CHECKS,
            _due,
            now=lapsed,
            holder="w3",
            lease_until=lapsed + timedelta(seconds=30),
            limit=1,
            shape="t",
        )
        assert [(c.pk, c.token, c.claimed_by) for c in again] == [(made[0].pk, 2, "w3")]
        stored = ReconciliationCheck.objects.get(pk=made[0].pk)
        assert CHECKS.holds(stored, 2) and not CHECKS.holds(stored, 1)


def test_also_sets_counts_and_first_moments(tenant_a: Tenant) -> None:
    now = timezone.now()
    with tenant_context(tenant_a):
        (made,) = _checks(tenant_a, 1, now)
        first = now.replace(microsecond=0)
        (taken,) = claim(
            CHECKS,
            _due,
            now=now,
            holder="w",
            lease_until=now + timedelta(seconds=1),
            limit=1,
            shape="also",
            also={"compensated_leaf": Increment(), "decided_at": SetIfNull(first), "detail": "x"},
        )
        assert (taken.compensated_leaf, taken.decided_at, taken.detail) == (1, first, "x")
        later = now + timedelta(seconds=2)
        (again,) = claim(
            CHECKS,
            _due,
            now=later,
            holder="w",
            lease_until=later + timedelta(seconds=1),
            limit=1,
            shape="also",
            also={"compensated_leaf": Increment(), "decided_at": SetIfNull(later)},
        )
        assert (again.compensated_leaf, again.decided_at, again.token) == (2, first, 2)


def test_candidates_that_can_match_nothing_claim_nothing(tenant_a: Tenant) -> None:
    now = timezone.now()
    with tenant_context(tenant_a):
        _checks(tenant_a, 1, now)
        nothing = claim(
            CHECKS,
            lambda moment: _due(moment).filter(handler__in=[]),
            now=now,
            holder="w",
            lease_until=now,
            limit=1,
            shape="none",
        )
        assert nothing == []
        assert ReconciliationCheck.objects.get().token == 0
