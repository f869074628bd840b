"""Approval decisions from Slack and the channel's messages (wired to `approvals` as it lands)."""

from __future__ import annotations

from typing import Any

from tenants.models import Membership, Tenant


def vote(
    tenant: Tenant, membership: Membership, request_id: str, choice: str, *, note: str, actor: str
) -> str:
    return "Approvals are not available yet: nothing was decided."


def status_text(tenant: Tenant, membership: Membership) -> str:
    return "No status yet."


def post_request(tenant: Tenant, request_id: str) -> None:
    return None


def refresh_request(tenant: Tenant, request_id: str) -> None:
    return None


def notify(tenant: Tenant, request_id: str, kind: str, detail: dict[str, Any]) -> None:
    return None
