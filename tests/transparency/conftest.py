"""Real chained records through the real ingest service (audit.services.ingest)."""

from __future__ import annotations

import pytest

from tenants.models import Tenant
from tests.support.chains import Writer


@pytest.fixture
def writer_a(tenant_a: Tenant) -> Writer:
    return Writer(tenant_a, "agent-a-1")


@pytest.fixture
def writer_b(tenant_b: Tenant) -> Writer:
    return Writer(tenant_b, "agent-b-1")
