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


# ---------------------------------------------------------------------------------- infra/test.sh

STUB_PYTHON = """#!/bin/sh
# pytest's stand-in: which phase ran, and that phase's exit status.
case "$*" in
  *"not postgres and not redis"*) echo sqlite >> "$CALLS"; exit "${SQLITE_RC:-0}" ;;
  *) echo full >> "$CALLS"; exit "${FULL_RC:-0}" ;;
esac
"""
STUB_APT = """#!/bin/sh
# apt-get's stand-in: `install` puts the packages where the script looks for them.
echo "apt-get $*" >> "$CALLS"
case "$*" in *install*)
  for f in "$CHROMIUM" "$NGINX"; do printf '#!/bin/sh\\n' > "$f"; chmod +x "$f"; done ;;
esac
"""


def _stub(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _test_sh(
    tmp_path: Path, *, uid: int = 0, installed: bool = True, **env: str
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """infra/test.sh on stand-ins: ruff, mypy, vulture and pytest (`.venv/bin`), `id`, `apt-get` (never
    the real one), and Chromium and nginx (present or not). Returns the run and what was called,
    in order."""
    repo = tmp_path / "repo"
    (repo / "infra").mkdir(parents=True)
    for name in ("test.sh", "services.sh", "prerequisites.sh"):
        (repo / "infra" / name).write_text((ROOT / "infra" / name).read_text())
    venv = tmp_path / "venv"
    venv.mkdir()
    calls = tmp_path / "calls"
    calls.touch()
    for tool in ("ruff", "mypy", "vulture"):
        _stub(venv / tool, f'#!/bin/sh\necho {tool} >> "$CALLS"\n')
    _stub(venv / "python", STUB_PYTHON)
    system = tmp_path / "system"
    system.mkdir()
    _stub(system / "id", f"#!/bin/sh\necho {uid}\n")
    _stub(system / "apt-get", STUB_APT)
    packages = tmp_path / "packages"
    packages.mkdir()
    if installed:
        for name in ("chromium", "nginx"):
            _stub(packages / name, "#!/bin/sh\n")
    result = subprocess.run(
        ["bash", "infra/test.sh"],
        cwd=repo,
        env={
            "PATH": f"{system}:/usr/bin:/bin",
            "BIN": str(venv),
            "CALLS": str(calls),
            "CHROMIUM": str(packages / "chromium"),
            "NGINX": str(packages / "nginx"),
            "DATABASE_URL": "unused",  # services.sh then probes nothing
            "REDIS_URL": "unused",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result, calls.read_text().split("\n")[:-1]


@pytest.mark.smoke
def test_make_test_runs_the_sqlite_phase_after_a_failed_postgres_phase_and_fails(tmp_path: Path) -> None:
    result, calls = _test_sh(tmp_path, FULL_RC="1")
    assert calls == ["ruff", "ruff", "mypy", "vulture", "full", "sqlite"]
    assert result.returncode == 1
    assert "failed: full suite on Postgres unused" in result.stderr


@pytest.mark.smoke
def test_make_test_fails_when_only_the_sqlite_phase_fails(tmp_path: Path) -> None:
    result, calls = _test_sh(tmp_path, SQLITE_RC="1")
    assert calls == ["ruff", "ruff", "mypy", "vulture", "full", "sqlite"]
    assert result.returncode == 1
    assert "failed: embedded SQLite" in result.stderr


@pytest.mark.smoke
def test_make_test_passes_when_every_phase_passes(tmp_path: Path) -> None:
    result, calls = _test_sh(tmp_path)
    assert calls == ["ruff", "ruff", "mypy", "vulture", "full", "sqlite"], result.stderr
    assert result.returncode == 0 and "== all passed" in result.stdout


@pytest.mark.smoke
def test_make_test_without_chromium_and_nginx_and_not_root_stops_at_once_naming_them(tmp_path: Path) -> None:
    result, calls = _test_sh(tmp_path, uid=1000, installed=False)
    assert result.returncode == 1
    assert calls == []  # not a linter, not a test: it stops before anything
    assert "needs these system packages, which are not installed: chromium nginx" in result.stderr
    assert "apt-get install chromium nginx" in result.stderr


@pytest.mark.smoke
def test_make_test_as_root_installs_chromium_and_nginx_then_runs(tmp_path: Path) -> None:
    result, calls = _test_sh(tmp_path, uid=0, installed=False)
    assert calls[:2] == ["apt-get update -qq", "apt-get install -y -qq chromium nginx"], result.stderr
    assert calls[2:] == ["ruff", "ruff", "mypy", "vulture", "full", "sqlite"]
    assert result.returncode == 0
