"""Settings, all from the environment.

Two modes run the same code:
- embedded (no DATABASE_URL, no REDIS_URL): SQLite, a filesystem Celery broker, an in-memory
  channel layer and a local cache, all under SAGAPLANE_DATA_DIR. Nothing to install.
- production (SAGAPLANE_ENV=production): Postgres, Redis, secure cookies, HSTS, and a refusal
  to start while any setting still has an insecure default.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import environ
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

SAGAPLANE_ENV = env.str("SAGAPLANE_ENV", default="development")
PRODUCTION = SAGAPLANE_ENV == "production"
DATA_DIR = Path(env.str("SAGAPLANE_DATA_DIR", default=str(BASE_DIR / ".sagaplane-data"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env.bool("DEBUG", default=False)


def _persisted_secret(name: str, make: callable) -> str:  # type: ignore[valid-type]
    """A development secret generated once and kept in the data folder, so sessions and
    encrypted values survive restarts of the embedded demo. Never used in production."""
    path = DATA_DIR / name
    if not path.exists():
        path.write_text(make())
        path.chmod(0o600)
    return path.read_text().strip()


_insecure: list[str] = []
if "SECRET_KEY" in env:
    SECRET_KEY = env.str("SECRET_KEY")
else:
    SECRET_KEY = _persisted_secret("secret_key", lambda: secrets.token_urlsafe(50))
    _insecure.append("SECRET_KEY is not set (a development key from the data folder is in use)")
if len(SECRET_KEY) < 32:
    _insecure.append("SECRET_KEY is shorter than 32 characters")

# Comma-separated Fernet keys; the first encrypts, all decrypt, so a rotation is "prepend the new key".
if "SAGAPLANE_MASTER_KEY" in env:
    SAGAPLANE_MASTER_KEYS = env.list("SAGAPLANE_MASTER_KEY")
else:
    SAGAPLANE_MASTER_KEYS = [_persisted_secret("master_key", lambda: Fernet.generate_key().decode())]
    _insecure.append("SAGAPLANE_MASTER_KEY is not set (a development key from the data folder is in use)")

DATABASE_URL = env.str("DATABASE_URL", default="")
REDIS_URL = env.str("REDIS_URL", default="")
EMBEDDED = not DATABASE_URL and not REDIS_URL

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

if PRODUCTION:
    if DEBUG:
        _insecure.append("DEBUG is on")
    if not DATABASE_URL:
        _insecure.append("DATABASE_URL is not set (SQLite is for the embedded demo only)")
    if not REDIS_URL:
        _insecure.append("REDIS_URL is not set (the embedded broker is for one machine only)")
    if "*" in ALLOWED_HOSTS or "ALLOWED_HOSTS" not in env:
        _insecure.append("ALLOWED_HOSTS is not set to the real host names")
    if _insecure:
        raise ImproperlyConfigured(
            "Refusing to start in production mode with insecure settings:\n- " + "\n- ".join(_insecure)
        )

INSTALLED_APPS = [
    "daphne",  # makes `runserver` an ASGI server, so websockets work in development
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "tenants",
    "audit",
    "sagas",
    "fleet",
    "approvals",
    "transparency",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "tenants.scoping.TenantContextResetMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{DATA_DIR / 'sagaplane.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL journal and a busy timeout let the web process and the Celery worker share the file.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DB_CONN_MAX_AGE", default=60))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict = {}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    _broker_dir = DATA_DIR / "broker"
    for _sub in ("out", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://localhost/"  # a host named, so kombu does not warn on every connect
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "data_folder_processed": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
    }
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE: dict = {
    # A checkpoint follows acceptance within about a second (ARCHITECTURE §2.3).
    "transparency-integrate": {"task": "transparency.integrate_grown_tenants", "schedule": 1.0},
    # An export whose worker died mid-build is re-queued, then failed after a few attempts.
    "transparency-export-sweep": {"task": "transparency.sweep_stale_exports", "schedule": 60.0},
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(DATA_DIR / "static")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = not PRODUCTION

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "tenants.errors.api_exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Sagaplane API",
    "DESCRIPTION": "Control plane for AI agents' real-world actions: ingest, gate, approvals, audit.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Content-Security-Policy: no inline script anywhere, no third-party origins.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "frame-ancestors": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
    }
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    # Probes inside the cluster speak plain http to the pod; redirecting them fails every probe.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Invitation tokens in request paths are credentials: written as references (frontend.log_redaction).
    "filters": {"invitation_tokens": {"()": "frontend.log_redaction.RedactInvitationTokens"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["invitation_tokens"]}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# Outgoing mail (invitations): EMAIL_URL such as smtp+tls://user:pass@host:587; the console otherwise.
globals().update(env.email_url("EMAIL_URL", default="consolemail://"))  # EMAIL_BACKEND, EMAIL_HOST, ...
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="Sagaplane <no-reply@sagaplane.local>")

# Ingest limits: a batch over either is refused whole with 413.
SAGAPLANE_MAX_BATCH_RECORDS = env.int("SAGAPLANE_MAX_BATCH_RECORDS", default=5000)
SAGAPLANE_MAX_BODY_BYTES = env.int("SAGAPLANE_MAX_BODY_BYTES", default=8 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = SAGAPLANE_MAX_BODY_BYTES

# Transparency log: checkpoint origin (and key name) is f"{prefix}/{tenant slug}"; exports are
# write-once files under the data folder unless a backend with a retention lock is configured.
SAGAPLANE_LOG_ORIGIN_PREFIX = env.str("SAGAPLANE_LOG_ORIGIN_PREFIX", default="sagaplane.local")
SAGAPLANE_EXPORT_STORAGE = {
    "BACKEND": env.str(
        "SAGAPLANE_EXPORT_STORAGE_BACKEND", default="transparency.storage.WriteOnceFileStorage"
    ),
    "OPTIONS": {"location": env.str("SAGAPLANE_EXPORT_DIR", default=str(DATA_DIR / "exports"))},
}
SAGAPLANE_LEAF_SOURCE = "transparency.sources.AuditLeafSource"
# An unfinished export with no progress for this long is presumed dead and re-queued; after this
# many builds have died it is marked failed with the reason.
SAGAPLANE_EXPORT_STALE_MINUTES = env.int("SAGAPLANE_EXPORT_STALE_MINUTES", default=10)
SAGAPLANE_EXPORT_MAX_ATTEMPTS = env.int("SAGAPLANE_EXPORT_MAX_ATTEMPTS", default=3)
