from __future__ import annotations

import pytest

from tenants.models import Tenant
from tests.support.chains import Writer


@pytest.fixture
def writer_a(tenant_a: Tenant) -> Writer:
    return Writer(tenant_a, "agent-a-1")
