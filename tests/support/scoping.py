"""Calling a service from a test the way a transport does: services assert the tenant's scope
(core.scoping.require_tenant) and never open one, so a test enters it, as a view or a task would."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from core.scoping import tenant_context, tenant_statements

R = TypeVar("R")


def in_tenant(action: Callable[..., R], tenant: Any, *args: Any, **kwargs: Any) -> R:
    """`action(tenant, *args, **kwargs)` inside `tenant_context(tenant)`: one transaction as the tenant."""
    with tenant_context(tenant):
        return action(tenant, *args, **kwargs)


def in_statements(action: Callable[..., R], tenant: Any, *args: Any, **kwargs: Any) -> R:
    """`action(tenant, *args, **kwargs)` inside `tenant_statements(tenant)`, as the gate's fast route
    calls the gate: no transaction of its own (on Postgres the decision's lean path), each statement
    carrying the tenant."""
    with tenant_statements(tenant):
        return action(tenant, *args, **kwargs)
