"""Who acts, as audit records name them, for actions that do not come from a request.

Requests name their person or key (`user:<name>`, `api-key:<prefix>`); an operator at a shell is
`cli:<login name>`, and work the system starts on its own is `system:<what>`."""

from __future__ import annotations

import getpass
import os


def cli_actor() -> str:
    """The operator running a management command, by their login name (the uid when the
    process has no name, as in some containers)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = f"uid{os.getuid()}"
    return f"cli:{name}"
