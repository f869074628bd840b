"""The suite's clean-up on Postgres, tried again while Postgres refuses it for a reason that passes:
another session still holding what it needs (a live-server thread's read, a child process closing
its connection). The fixtures that use it are in tests/conftest.py."""

from __future__ import annotations

import time
from typing import Any


def retried_while(refusal: str, action: Any, *, patience_s: float) -> None:
    """Run `action`; while Postgres refuses it with `refusal` (another session still holds what it
    needs), try again until `patience_s` has passed. Other errors fail at once."""
    from django.core.management.base import CommandError
    from django.db.utils import OperationalError

    deadline = time.monotonic() + patience_s
    while True:
        try:
            action()
            return
        except (CommandError, OperationalError) as exc:
            if not _says(exc, refusal) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # cleanup only: the other session finishing, not an event awaited


def _says(exc: BaseException | None, refusal: str) -> bool:
    """`refusal` is in `exc` or in what caused it: `flush` wraps Postgres' error in a CommandError
    whose own message names only the database."""
    while exc is not None:
        if refusal in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
