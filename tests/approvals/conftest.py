"""Approvals tests run on the database store. Their people are the suite's (tests/conftest.py:
alice's payments agent, alice the requester; ann and ben, approvers; adam, an admin); the helpers
(Agent, wire_policy, vote, member) are in tests/support/approvals.py."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _database_store(database_store: None) -> None:
    """Every approvals test runs on the database store (tests/conftest.database_store)."""
    return database_store
