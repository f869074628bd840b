"""Load for tests and benchmarks that must hold on a busy machine: CPU hogs on every core.

A hog spins until it is killed or its parent is gone (it is in a session of its own, so a runner
killed without running its clean-up, a pytest stopped by `timeout`, say, would otherwise leave it
spinning for hours)."""

from __future__ import annotations

import os
import subprocess
import sys

# The parent's pid comes from the parent: a hog asking for it at start-up could already be an
# orphan by then, and would spin forever.
_SPIN_WHILE_PARENT_LIVES = (
    "import os, sys\nparent = int(sys.argv[1])\nwhile os.getppid() == parent:\n    pass\n"
)


def cpu_hogs(per_core: int = 2) -> list[subprocess.Popen[bytes]]:
    """`per_core` spinning processes per core, each the leader of its own session (stop them by
    their process group, as every other process a test starts)."""
    return [
        subprocess.Popen(
            [sys.executable, "-c", _SPIN_WHILE_PARENT_LIVES, str(os.getpid())], start_new_session=True
        )
        for _ in range(per_core * (os.cpu_count() or 2))
    ]
