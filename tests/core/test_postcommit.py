"""Post-commit work is best effort: a failure is logged, the transaction's outcome stands."""

from __future__ import annotations

import functools
import logging

import pytest
from django.db import transaction

from core.postcommit import after_commit


def _explode(message: str) -> None:
    raise ConnectionError(message)


@pytest.mark.smoke
@pytest.mark.django_db(transaction=True)
def test_a_failing_callback_is_logged_and_does_not_escape(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []
    with caplog.at_level(logging.WARNING, logger="core.postcommit"), transaction.atomic():
        # A partial, as the live-event hook used: it has no __qualname__ for Django's own log line.
        after_commit("live event", functools.partial(_explode, "broker is down"))
        after_commit("the next hook", lambda: ran.append("next"))
    assert ran == ["next"]  # one failing hook does not stop the others
    assert "after commit: live event failed" in caplog.text and "broker is down" in caplog.text


@pytest.mark.smoke
@pytest.mark.django_db(transaction=True)
def test_nothing_runs_after_a_rollback() -> None:
    ran: list[str] = []
    with pytest.raises(RuntimeError), transaction.atomic():
        after_commit("never", lambda: ran.append("ran"))
        raise RuntimeError("roll back")
    assert ran == []
