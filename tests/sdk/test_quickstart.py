"""The SDK quick-start works word for word: sdk/README.md's code is sdk/examples/quickstart.py,
its key command is the venv's `manage.py create_api_key` (not a bare `python`, which has no
Django) with the scopes the shipper needs (`read` too: without it the shipper warns on every
run), and that file, run with the key that command makes, ships a completed saga to a live control
plane without a warning."""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import sagaplane as sp
from django.core.management import call_command

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "sdk" / "README.md").read_text()
QUICKSTART = REPO / "sdk" / "examples" / "quickstart.py"


def _section() -> str:
    start = README.index("## Quickstart")
    return README[start : README.index("\n## ", start + 1)]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", _section(), flags=re.S)


def _key_command() -> list[str]:
    """The arguments of the README's `create_api_key` command, as it spells them."""
    for line in _blocks("bash")[0].splitlines():
        found = re.search(r'"\$\((.*?) \| tail -n 1\)"', line)
        if found:
            return shlex.split(found.group(1))
    raise AssertionError("the quick-start creates no key")


def test_the_readme_quickstart_is_the_example_file_and_names_the_venv_and_the_scopes() -> None:
    assert _blocks("python") == [QUICKSTART.read_text()]
    command = _key_command()
    assert command[:3] == [".venv/bin/python", "manage.py", "create_api_key"]
    scopes = set(command[command.index("--scopes") + 1].split(","))
    assert {"ingest", "gate", "read"} <= scopes
    # The exception semantics, in the quick-start itself.
    assert "sp.EffectNotApplied" in _section() and "orphaned for recovery" in _section()


def test_the_quickstart_runs_against_a_live_control_plane_without_a_warning(
    transactional_db: None, live_server: Any, alice: Any, tmp_path: Path
) -> None:
    command = _key_command()
    arguments = command[command.index("create_api_key") + 1 :]
    arguments[arguments.index("--tenant") + 1] = alice.tenant.slug  # the README's is `demo`
    out = io.StringIO()
    call_command("create_api_key", *arguments, stdout=out)
    key = out.getvalue().strip().splitlines()[-1]  # what `| tail -n 1` keeps
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGAPLANE_", "DATABASE_"))}
    env.update(SAGAPLANE_URL=live_server.url, SAGAPLANE_API_KEY=key)
    result = subprocess.run(
        [sys.executable, str(QUICKSTART)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == "", result.stderr  # no warning (the shipper's about `read` was one)
    saga_id = re.search(r"saga (\S+): ready", result.stdout).group(1)  # type: ignore[union-attr]
    saga = sp.Client(live_server.url, alice.api_key).request("GET", f"/api/v1/sagas/{saga_id}")
    assert saga.status == 200, saga.body
    assert saga.body["saga"]["name"] == "checkout" and saga.body["saga"]["status"] == "completed"
