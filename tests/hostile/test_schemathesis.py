"""schemathesis over /api/schema against the README's production command on Postgres (issue 9,
defect 7): every operation, with generated valid and invalid input, as an API key holding every
scope and as a signed-in owner. Zero 5xx, and every answer (the 4xx included) matches what the
schema documents for it.

Bounded: at most MAX_EXAMPLES cases per operation and phase, one worker, a fixed seed (so a run
in CI is reproducible; SCHEMATHESIS_SEED picks another)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.hostile.production import (
    OWNER_PASSWORD,
    PROXY_HEADERS,
    ControlPlane,
    control_plane,
    manage,
    own_database,
    own_redis,
    sign_in,
)
from tests.support.production_env import production_env

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

MAX_EXAMPLES = 20
SEED = os.environ.get("SCHEMATHESIS_SEED", "20261203")
CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance"
RUN_TIMEOUT_S = 900


def _schemathesis(
    server: ControlPlane, headers: dict[str, str], report: Path
) -> subprocess.CompletedProcess[str]:
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "run",
        f"{server.url}/api/schema?format=json",
        "--url",
        server.url,
        "--checks",
        CHECKS,
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        SEED,
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--generation-database",
        "none",
        # Credentials are the ones given here: generated Authorization values would only test 401s.
        "--generation-with-security-parameters",
        "false",
        "--no-color",
        "--report",
        "junit",
        "--report-junit-path",
        str(report),
    ]
    for name, value in {**PROXY_HEADERS, **headers}.items():
        command += ["--header", f"{name}: {value}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=report.parent)


def _every_scope_key(env: dict[str, str]) -> str:
    out = manage(
        env,
        "create_api_key",
        "--tenant",
        "hostile",
        "--name",
        "schemathesis",
        "--scopes",
        "ingest,gate,read,recovery,audit,control",
    )
    return out.strip().splitlines()[-1]


def _owner_session(server: ControlPlane) -> dict[str, str]:
    """Sign in as the tenant's owner through the sign-in page; the headers a browser would send."""
    return sign_in(server, "owner@hostile.example", OWNER_PASSWORD)


def _assert_clean(run: subprocess.CompletedProcess[str], who: str) -> None:
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"schemathesis as {who} found failures:\n{output[-12000:]}"
    # Not vacuous: it reached the API and ran cases.
    assert re.search(r"\b\d+ passed\b", output) or "passed" in output, output[-4000:]


def test_schemathesis_finds_no_server_error_and_no_schema_violation(tmp_path: Path) -> None:
    with own_redis(tmp_path) as redis_server, own_database() as database:
        env = production_env(database.url, redis_server.url, tmp_path)
        manage(env, "collectstatic", "--noinput")  # the sign-in page needs its stylesheet's manifest
        with control_plane(env, workers=1) as server:
            schema = httpx.get(f"{server.url}/api/schema?format=json", headers=PROXY_HEADERS, timeout=30)
            assert schema.status_code == 200, schema.text
            assert len(schema.json()["paths"]) > 15

            key = _every_scope_key(env)
            as_key = _schemathesis(server, {"Authorization": f"Bearer {key}"}, tmp_path / "key.xml")
            _assert_clean(as_key, "an API key with every scope")

            as_owner = _schemathesis(server, _owner_session(server), tmp_path / "owner.xml")
            _assert_clean(as_owner, "the signed-in owner")
            assert "Internal Server Error" not in server.log_tail()
