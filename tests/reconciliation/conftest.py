"""Reconciliation fixtures: agents' writers for two tenants, and no delay before a scan checks a
compensation. The sagas whose steps were compensated are written by
tests/support/chains.compensated_saga."""

from __future__ import annotations

from typing import Any

import pytest

from tenants.models import Tenant
from tests.support.chains import Writer


@pytest.fixture
def no_delay(settings: Any) -> None:
    settings.SAGAPLANE_RECONCILE_DELAY_SECONDS = 0


@pytest.fixture
def agent_a(tenant_a: Tenant) -> Writer:
    return Writer(tenant_a, "agent-a-1")


@pytest.fixture
def agent_b(tenant_b: Tenant) -> Writer:
    return Writer(tenant_b, "agent-b-1")
