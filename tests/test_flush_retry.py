"""The test suite's own clean-up: a flush that Postgres chose as a deadlock victim is tried again
(Django's `flush` wraps the database's error in a CommandError naming only the database)."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError
from django.db.utils import OperationalError

from tests.support.cleanup import retried_while


def _flush_failing(times: int) -> tuple[list[int], object]:
    calls: list[int] = []

    def flush() -> None:
        calls.append(1)
        if len(calls) <= times:
            try:
                raise OperationalError("deadlock detected\nDETAIL: Process 1 waits for AccessExclusiveLock")
            except OperationalError as exc:
                raise CommandError("Database test_x couldn't be flushed.") from exc

    return calls, flush


def test_a_flush_failed_by_a_deadlock_is_tried_again() -> None:
    calls, flush = _flush_failing(times=1)
    retried_while("deadlock detected", flush, patience_s=30.0)
    assert len(calls) == 2


def test_another_error_fails_at_once() -> None:
    calls: list[int] = []

    def flush() -> None:
        calls.append(1)
        raise CommandError("Database test_x couldn't be flushed.") from OperationalError("relation missing")

    with pytest.raises(CommandError):
        retried_while("deadlock detected", flush, patience_s=30.0)
    assert len(calls) == 1
