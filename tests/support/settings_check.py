"""`manage.py check` in a clean environment, and what its refusal of a configuration looks like."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def manage_check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE")
        and not k.startswith(("SAGAPLANE_", "DB_"))
    }
    clean.update({"SAGAPLANE_DATA_DIR": str(tmp_path), **env})
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


def refused_to_start(result: subprocess.CompletedProcess, *messages: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Refusing to start: invalid configuration" in result.stderr, result.stderr
    for message in messages:
        assert message in result.stderr, (message, result.stderr)
    assert "Traceback" not in result.stderr  # the list of problems, not a stack
