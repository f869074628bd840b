"""Production mode refuses insecure defaults and says which; embedded mode needs nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.settings_check import manage_check, refused_to_start

ROOT = Path(__file__).resolve().parents[2]


def _load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL", "SECRET_KEY")
    }
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
        "SAGAPLANE_WEBAUTHN_RP_ID is not set",
    ):
        assert problem in result.stderr, problem


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.postgres
def test_production_starts_when_configured(tmp_path: Path) -> None:
    """The README's production command, with every required setting and nothing else: it starts,
    both probes answer 200 with every backing service ready, and it behaves as production (https
    enforced outside the probes, HSTS behind the TLS proxy)."""
    import httpx

    from tests.hostile.production import PROXY_HEADERS, control_plane, own_database, own_redis
    from tests.support.production_env import production_env

    with own_redis(tmp_path) as redis_server, own_database() as database:
        env = production_env(database.url, redis_server.url, tmp_path)
        with control_plane(env, workers=1) as server, httpx.Client(base_url=server.url, timeout=30) as plain:
            health = plain.get("/healthz")
            assert (health.status_code, health.json()) == (200, {"status": "ok"})
            ready = plain.get("/readyz")
            assert ready.status_code == 200, f"{ready.text}\n{server.log_tail()}"
            checks = ready.json()["checks"]
            assert {"database", "broker", "redis"} <= set(checks) and set(checks.values()) == {"ok"}

            assert plain.get("/login/").status_code == 301  # plain http elsewhere goes to https
            page = plain.get("/login/", headers=PROXY_HEADERS)
            assert page.status_code == 200 and "max-age=31536000" in page.headers["Strict-Transport-Security"]
            with server.client(timeout=30) as agent:  # the API key made by create_api_key works
                assert agent.get("/api/v1/sagas").status_code == 200


# ------------------------------------------------------------------ every value checked at start-up


@pytest.mark.smoke
def test_production_spelled_differently_is_refused_not_read_as_development(tmp_path: Path) -> None:
    refused_to_start(
        manage_check(tmp_path, SAGAPLANE_ENV="Production"),
        "SAGAPLANE_ENV must be one of development, production (got 'Production')",
    )


@pytest.mark.smoke
def test_a_malformed_master_key_is_refused_in_development_and_never_echoed(tmp_path: Path) -> None:
    from cryptography.fernet import Fernet

    good = Fernet.generate_key().decode()
    result = manage_check(tmp_path, SAGAPLANE_MASTER_KEY=f"{good},not-a-fernet-key-but-a-secret")
    refused_to_start(result, "SAGAPLANE_MASTER_KEY must be one or more Fernet keys", "key 2 of 2 is not one")
    assert good not in result.stderr and "not-a-fernet-key-but-a-secret" not in result.stderr


@pytest.mark.smoke
def test_every_malformed_value_is_named_at_once(tmp_path: Path) -> None:
    result = manage_check(
        tmp_path,
        DEBUG="ture",
        LOG_LEVEL="verbose",
        DATABASE_URL="mysql://app:hunter2secret@db.internal:3306/sagaplane",
        REDIS_URL="redis://cache.internal:6379/zero",
        ALLOWED_HOSTS="https://sagaplane.example.com/",
        CSRF_TRUSTED_ORIGINS="sagaplane.example.com",
        DB_POOL_MAX_SIZE="0",
        DB_POOL_TIMEOUT="nan",
        SAGAPLANE_MAX_BATCH_RECORDS="5k",
        SAGAPLANE_EXPORT_MAX_ATTEMPTS="-1",
        SAGAPLANE_EXPORT_STORAGE_BACKEND="transparency.nowhere.Storage",
        SAGAPLANE_LOG_ORIGIN_PREFIX="my log+1",
        EMAIL_URL="carrier-pigeon://coop",
        DEFAULT_FROM_EMAIL="nobody",
        SECURE_HSTS_SECONDS="a year",
        CELERY_TASK_ALWAYS_EAGER="maybe",
    )
    refused_to_start(
        result,
        "DEBUG must be true or false",
        "LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL (got 'verbose')",
        "DATABASE_URL must be a URL starting postgres:// or postgresql:// or sqlite://; got scheme 'mysql'",
        "REDIS_URL must be a redis:// URL whose path, if any, is a database number",
        "ALLOWED_HOSTS must be host names",
        "CSRF_TRUSTED_ORIGINS must be origins such as https://",
        "DB_POOL_MAX_SIZE must be a whole number from 1 to 1000 (got '0')",
        "DB_POOL_TIMEOUT must be a number of seconds above 0",
        "SAGAPLANE_MAX_BATCH_RECORDS must be a whole number from 1 to 1000000 (got '5k')",
        "SAGAPLANE_EXPORT_MAX_ATTEMPTS must be a whole number from 1 to 100 (got '-1')",
        "SAGAPLANE_EXPORT_STORAGE_BACKEND must be the dotted path of a storage class",
        "SAGAPLANE_LOG_ORIGIN_PREFIX must be a schema-less name",
        "EMAIL_URL must be a URL starting smtp://",
        "DEFAULT_FROM_EMAIL must be an e-mail address",
        "SECURE_HSTS_SECONDS must be a whole number at least 0 (got 'a year')",
        "CELERY_TASK_ALWAYS_EAGER must be true or false",
    )
    # URLs may carry passwords: the message names the variable, never the value.
    assert "hunter2secret" not in result.stderr and "cache.internal" not in result.stderr


@pytest.mark.smoke
def test_production_lists_malformed_and_insecure_settings_together(tmp_path: Path) -> None:
    result = manage_check(tmp_path, SAGAPLANE_ENV="production", DB_POOL="sometimes")
    refused_to_start(result, "DB_POOL must be true or false (also 1/0, yes/no, on/off) (got 'sometimes')")
    assert "Refusing to start in production mode with insecure settings" in result.stderr
    assert "SECRET_KEY is not set" in result.stderr


@pytest.mark.smoke
def test_well_formed_values_pass_check(tmp_path: Path) -> None:
    from cryptography.fernet import Fernet

    result = manage_check(
        tmp_path,
        SAGAPLANE_ENV="development",
        SAGAPLANE_MASTER_KEY=f"{Fernet.generate_key().decode()}, {Fernet.generate_key().decode()}",
        DEBUG="off",
        LOG_LEVEL="WARNING",
        ALLOWED_HOSTS="sagaplane.example.com,.example.org,127.0.0.1",
        CSRF_TRUSTED_ORIGINS="https://sagaplane.example.com",
        DB_POOL_MAX_SIZE="8",
        DB_POOL_TIMEOUT="2.5",
        EMAIL_URL="smtp+tls://mailer:pw@smtp.example.com:587",
        DEFAULT_FROM_EMAIL="Sagaplane <no-reply@example.com>",
        SAGAPLANE_LOG_ORIGIN_PREFIX="sagaplane.example.com/log",
    )
    assert result.returncode == 0, result.stderr


def _production(tmp_path: Path, **env: str | None) -> subprocess.CompletedProcess:
    """`manage.py check` in production mode, every setting secure but those of `env` (None: unset);
    no server is needed."""
    from cryptography.fernet import Fernet

    settings = {
        "SAGAPLANE_ENV": "production",
        "SECRET_KEY": "s" * 50,
        "SAGAPLANE_MASTER_KEY": Fernet.generate_key().decode(),
        "DATABASE_URL": "postgres://app:pw@db.internal:5432/sagaplane",
        "REDIS_URL": "redis://cache.internal:6379/0",
        "ALLOWED_HOSTS": "sagaplane.example.com",
        "CSRF_TRUSTED_ORIGINS": "https://sagaplane.example.com",
        "SAGAPLANE_PUBLIC_URL": "https://sagaplane.example.com",
        "SAGAPLANE_WEBAUTHN_RP_ID": "sagaplane.example.com",
        "SAGAPLANE_WEBAUTHN_ORIGINS": "https://sagaplane.example.com",
    }
    merged = {**settings, **env}
    return manage_check(tmp_path, **{name: value for name, value in merged.items() if value is not None})


@pytest.mark.smoke
@pytest.mark.parametrize(
    ("webauthn", "problems"),
    [
        (
            {"SAGAPLANE_WEBAUTHN_RP_ID": None, "SAGAPLANE_WEBAUTHN_ORIGINS": None},
            ["SAGAPLANE_WEBAUTHN_RP_ID is not set (passkeys would be bound to the default, localhost)"],
        ),
        (
            {"SAGAPLANE_WEBAUTHN_ORIGINS": None},
            ["SAGAPLANE_WEBAUTHN_ORIGINS is not set (the https:// origins the dashboard is served from)"],
        ),
        (
            {"SAGAPLANE_WEBAUTHN_RP_ID": "localhost", "SAGAPLANE_WEBAUTHN_ORIGINS": "https://localhost"},
            ["SAGAPLANE_WEBAUTHN_ORIGINS: https://localhost's host localhost is not one of ALLOWED_HOSTS"],
        ),
        (
            {"SAGAPLANE_WEBAUTHN_RP_ID": "other.example.com"},
            [
                "SAGAPLANE_WEBAUTHN_ORIGINS: https://sagaplane.example.com is not on the relying party "
                "SAGAPLANE_WEBAUTHN_RP_ID (other.example.com) or under it"
            ],
        ),
        (
            {"SAGAPLANE_WEBAUTHN_ORIGINS": "http://sagaplane.example.com,https://evil.example.net"},
            [
                "SAGAPLANE_WEBAUTHN_ORIGINS: http://sagaplane.example.com is not an https:// origin",
                "SAGAPLANE_WEBAUTHN_ORIGINS: https://evil.example.net is not on the relying party",
                "SAGAPLANE_WEBAUTHN_ORIGINS: https://evil.example.net's host evil.example.net is not one of "
                "ALLOWED_HOSTS",
            ],
        ),
        (
            {"SAGAPLANE_WEBAUTHN_RP_ID": "10.0.0.5", "ALLOWED_HOSTS": "10.0.0.5"},
            ["SAGAPLANE_WEBAUTHN_RP_ID is an IP address (10.0.0.5); WebAuthn needs a host name"],
        ),
    ],
)
def test_production_refuses_a_relying_party_that_does_not_match_allowed_hosts(
    tmp_path: Path, webauthn: dict[str, str | None], problems: list[str]
) -> None:
    result = _production(tmp_path, **webauthn)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Refusing to start in production mode with insecure settings" in result.stderr, result.stderr
    for problem in problems:
        assert problem in result.stderr, (problem, result.stderr)
    assert "Traceback" not in result.stderr


@pytest.mark.smoke
@pytest.mark.parametrize(
    ("rp_id", "origins", "hosts"),
    [
        ("sagaplane.example.com", "https://sagaplane.example.com", "sagaplane.example.com"),
        ("example.com", "https://sagaplane.example.com:8443", ".example.com"),
        ("example.com", "https://a.example.com,https://b.example.com", "a.example.com,b.example.com"),
    ],
)
def test_production_starts_with_a_relying_party_matching_allowed_hosts(
    tmp_path: Path, rp_id: str, origins: str, hosts: str
) -> None:
    result = _production(
        tmp_path, SAGAPLANE_WEBAUTHN_RP_ID=rp_id, SAGAPLANE_WEBAUTHN_ORIGINS=origins, ALLOWED_HOSTS=hosts
    )
    assert result.returncode == 0, result.stderr
