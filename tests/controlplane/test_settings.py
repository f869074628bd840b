"""Production mode refuses insecure defaults and says which; embedded mode needs nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    clean.update({"SAGAPLANE_DATA_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "controlplane.settings"})
    clean.update(env)
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.DATABASES['default']['ENGINE'], settings.CELERY_BROKER_URL)",
        ],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.smoke
def test_embedded_defaults(tmp_path: Path) -> None:
    result = _load_settings(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "sqlite3" in result.stdout and "filesystem://" in result.stdout
    assert (tmp_path / "secret_key").exists() and (tmp_path / "master_key").exists()


@pytest.mark.smoke
def test_production_refuses_insecure_defaults_and_names_them(tmp_path: Path) -> None:
    result = _load_settings(tmp_path, SAGAPLANE_ENV="production", DEBUG="1")
    assert result.returncode != 0
    for problem in (
        "SECRET_KEY is not set",
        "SAGAPLANE_MASTER_KEY is not set",
        "DEBUG is on",
        "DATABASE_URL is not set",
        "REDIS_URL is not set",
        "ALLOWED_HOSTS",
    ):
        assert problem in result.stderr, problem


@pytest.mark.smoke
def test_production_starts_when_configured(tmp_path: Path) -> None:
    from cryptography.fernet import Fernet

    result = _load_settings(
        tmp_path,
        SAGAPLANE_ENV="production",
        SECRET_KEY="x" * 50,
        SAGAPLANE_MASTER_KEY=Fernet.generate_key().decode(),
        DATABASE_URL="postgres://sagaplane@127.0.0.1:5432/sagaplane",
        REDIS_URL="redis://127.0.0.1:6379/0",
        ALLOWED_HOSTS="sagaplane.example.com",
    )
    assert result.returncode == 0, result.stderr
    assert "postgresql" in result.stdout and "redis://" in result.stdout
