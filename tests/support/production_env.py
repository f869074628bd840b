"""The environment of the README's production command (SAGAPLANE_ENV=production, every required
setting, the runtime role only), for the processes tests and benchmarks start: plain http on
loopback behind an assumed TLS-terminating proxy (clients send `X-Forwarded-Proto: https`)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from cryptography.fernet import Fernet


def production_env(database_url: str, redis_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "SAGAPLANE_", "DB_")) and k != "DATABASE_OWNER_URL"
    }
    env.update(
        {
            "SAGAPLANE_ENV": "production",
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "SECRET_KEY": "hostile-tests-" + uuid.uuid4().hex + uuid.uuid4().hex,
            "SAGAPLANE_MASTER_KEY": Fernet.generate_key().decode(),
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "SAGAPLANE_WEBAUTHN_RP_ID": "localhost",  # passkeys need a host name, never an address
            "SAGAPLANE_WEBAUTHN_ORIGINS": "https://localhost",
            "CSRF_TRUSTED_ORIGINS": "https://127.0.0.1",
            "SAGAPLANE_PUBLIC_URL": "https://127.0.0.1",
            "SAGAPLANE_DATA_DIR": str(data_dir),
            "SAGAPLANE_EXPORT_DIR": str(data_dir / "exports"),
            "STATIC_ROOT": str(data_dir / "static"),
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env
