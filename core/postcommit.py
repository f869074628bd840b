"""Best-effort work after a commit: live events, task hints. The commit is what the client was
promised; nothing that runs after it may turn the answer into an error.

Django's `on_commit(..., robust=True)` would log a failure, but its log line reads the callback's
`__qualname__`, which a `functools.partial` lacks, so the logging itself raised and the request
answered 500 after its records were stored (the client then resent them). Here every callback is
wrapped in a plain function that catches and logs with a description of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import transaction

log = logging.getLogger(__name__)


def after_commit(description: str, func: Callable[[], object]) -> None:
    """Run `func` once the current transaction commits (at once outside one); a failure is logged
    as a warning naming `description` and never propagates. Nothing runs after a rollback."""

    def best_effort() -> None:
        try:
            func()
        except Exception:  # best effort by contract: the commit already earned its answer
            log.warning("after commit: %s failed; the committed work stands", description, exc_info=True)

    transaction.on_commit(best_effort)
