"""The CI scripts never print a password: `infra/services.sh`'s `redact_url` masks the user-info
password and a `password=` query parameter, and keeps everything else readable."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _services_sh(script: str, *args: str, **env: str) -> str:
    # With DATABASE_URL and REDIS_URL set, sourcing services.sh probes and creates nothing.
    result = subprocess.run(
        ["bash", "-c", f"source infra/services.sh && {script}", "services.sh", *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": "unused", "REDIS_URL": "unused", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout


def _redact(url: str) -> str:
    return _services_sh('redact_url "$1"', url)


@pytest.mark.smoke
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgres://sagaplane:hunter2secret@127.0.0.1:5432/sagaplane_tests",
            "postgres://sagaplane:***@127.0.0.1:5432/sagaplane_tests",
        ),
        ("redis://:hunter2secret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgres://u:hunter2@secret@db/app", "postgres://u:***@db/app"),
        (
            "postgres://db/app?user=u&password=hunter2secret&sslmode=require",
            "postgres://db/app?user=u&password=***&sslmode=require",
        ),
        ("redis://127.0.0.1:6379/7", "redis://127.0.0.1:6379/7"),
        ("postgres://sagaplane@127.0.0.1/sagaplane", "postgres://sagaplane@127.0.0.1/sagaplane"),
    ],
)
def test_redact_url_hides_only_the_password(url: str, shown: str) -> None:
    assert _redact(url) == shown
    assert "hunter2" not in _redact(url)


@pytest.mark.smoke
def test_the_suite_banner_names_the_services_without_their_passwords() -> None:
    banner = _services_sh(
        "describe_services",
        DATABASE_URL="postgres://sagaplane:hunter2secret@127.0.0.1:5432/sagaplane_tests",
        REDIS_URL="redis://:hunter2other@127.0.0.1:6379/7",
    )
    assert banner == (
        "Postgres postgres://sagaplane:***@127.0.0.1:5432/sagaplane_tests"
        " with Redis redis://:***@127.0.0.1:6379/7\n"
    )
    # infra/test.sh prints the services through describe_services, never the variables themselves.
    test_sh = (ROOT / "infra" / "test.sh").read_text()
    assert "$(describe_services)" in test_sh
    for line in test_sh.splitlines():
        if line.lstrip().startswith("echo"):
            assert "DATABASE_URL" not in line and "REDIS_URL" not in line, line
