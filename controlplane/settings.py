"""Settings, all from the environment.

Two modes run the same code:
- embedded (no DATABASE_URL, no REDIS_URL): SQLite, a filesystem Celery broker, an in-memory
  channel layer and a local cache, all under SAGAPLANE_DATA_DIR. Nothing to install.
- production (SAGAPLANE_ENV=production): Postgres, Redis, secure cookies, HSTS, and a refusal
  to start while any setting still has an insecure default.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import environ
from cryptography.fernet import Fernet

from controlplane.config import Config

BASE_DIR = Path(__file__).resolve().parent.parent

# Every variable is read through `config`, which checks it and collects each problem; the last
# line of this module refuses to start while there is any (controlplane/config.py).
config = Config(os.environ)
env = environ.Env()  # only to turn URLs that `config` has checked into Django's dictionaries

SAGAPLANE_ENV = config.choice("SAGAPLANE_ENV", ["development", "production"], default="development")
PRODUCTION = SAGAPLANE_ENV == "production"
DATA_DIR = config.directory("SAGAPLANE_DATA_DIR", BASE_DIR / ".sagaplane-data")

DEBUG = config.boolean("DEBUG", default=False)


def _persisted_secret(name: str, make: Callable[[], str]) -> str:
    """A development secret generated once and kept in the data folder, so sessions and
    encrypted values survive restarts of the embedded demo. Never used in production."""
    path = DATA_DIR / name
    try:
        if not path.exists():
            path.write_text(make())
            path.chmod(0o600)
        return path.read_text().strip()
    except OSError:
        return make()  # the data folder is unusable: already a reported problem, start is refused


_insecure: list[str] = []
if "SECRET_KEY" in config:
    SECRET_KEY = config.environ["SECRET_KEY"]
else:
    SECRET_KEY = _persisted_secret("secret_key", lambda: secrets.token_urlsafe(50))
    _insecure.append("SECRET_KEY is not set (a development key from the data folder is in use)")
if len(SECRET_KEY) < 32:
    _insecure.append("SECRET_KEY is shorter than 32 characters")

# Comma-separated Fernet keys; the first encrypts, all decrypt, so a rotation is "prepend the new key".
_master_keys = config.fernet_keys("SAGAPLANE_MASTER_KEY")
if _master_keys is not None:
    SAGAPLANE_MASTER_KEYS = _master_keys
else:
    SAGAPLANE_MASTER_KEYS = [_persisted_secret("master_key", lambda: Fernet.generate_key().decode())]
    if "SAGAPLANE_MASTER_KEY" not in config:
        _insecure.append("SAGAPLANE_MASTER_KEY is not set (a development key from the data folder is in use)")

DATABASE_URL = config.url("DATABASE_URL", ("postgres", "postgresql", "sqlite"), needs_path=True)
# Two Postgres roles (core/rls.py): DATABASE_URL's runtime role (web, workers, beat) owns nothing
# and is bound by row-level security; the owner role runs `migrate` and owns the tables. Only the
# process that migrates needs the owner's URL (`migrate` refuses to run on Postgres without it).
DATABASE_OWNER_URL = config.database_owner_url("DATABASE_OWNER_URL", "DATABASE_URL", DATABASE_URL)
REDIS_URL = config.redis_url("REDIS_URL")
EMBEDDED = not DATABASE_URL and not REDIS_URL
# Where the gate's budget and rate counters live: Redis (one Lua script, the fast path) when there
# is one, else the database alone. The ledger of authorisations is always in the database.
SAGAPLANE_GATE_STORE = config.choice(
    "SAGAPLANE_GATE_STORE", ["redis", "database"], default="redis" if REDIS_URL else "database"
)
if SAGAPLANE_GATE_STORE == "redis" and not REDIS_URL:
    config.refuse("SAGAPLANE_GATE_STORE", "'database' when REDIS_URL is not set", SAGAPLANE_GATE_STORE)

ALLOWED_HOSTS = config.hosts("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = config.origins("CSRF_TRUSTED_ORIGINS", [])

if PRODUCTION:
    if DEBUG:
        _insecure.append("DEBUG is on")
    if not DATABASE_URL or DATABASE_URL.startswith("sqlite"):
        _insecure.append("DATABASE_URL is not set to Postgres (SQLite is for the embedded demo only)")
    if not REDIS_URL:
        _insecure.append("REDIS_URL is not set (the embedded broker is for one machine only)")
    if "*" in ALLOWED_HOSTS or "ALLOWED_HOSTS" not in config:
        _insecure.append("ALLOWED_HOSTS is not set to the real host names")

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
    "slackapp",  # not "slack": slack_sdk once shipped a top-level module of that name
    "passkeys",
    "transparency",
    "recovery",
    "reconciliation",
    "frontend",
    "axes",  # sign-in throttling (below)
]

MIDDLEWARE = [
    # Outermost: the request id, the request's log line, and the ingest and gate metrics
    # (controlplane/observability.py).
    "controlplane.observability.RequestObservabilityMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Before every layer that reads the database: how long a request waits for a pooled
    # connection when the database may be down (core/availability.py).
    "core.availability.RequestConnectionWait",
    "core.rls.RuntimeRoleGuardMiddleware",
    # Outside every other layer: refuses NUL in the path or query, and shapes every non-2xx API
    # answer as JSON whoever produced it (core/errors.py).
    "core.errors.ErrorShapeMiddleware",
    # A plain proof GET by a recently checked key is answered here, without the layers below or
    # DRF; anything else passes on untouched (transparency/lean.py).
    "transparency.lean.LeanProofMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "core.scoping.TenantContextResetMiddleware",
    # Last, as django-axes asks: turns a lockout flagged during sign-in into its 429 answer.
    "axes.middleware.AxesMiddleware",
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

# Postgres connections per process are bounded by a pool: under ASGI each request runs in a thread
# of its own, and persistent per-thread connections (CONN_MAX_AGE > 0) piled up until Postgres
# refused new ones. A process holds at most DB_POOL_MAX_SIZE connections; a request that finds
# them all busy waits up to DB_POOL_TIMEOUT seconds for one. DB_POOL=false (e.g. behind
# pgbouncer) opens one connection per request instead and closes it after.
DB_POOL = config.boolean("DB_POOL", default=True)
DB_POOL_MAX_SIZE = config.integer("DB_POOL_MAX_SIZE", 4, minimum=1, maximum=1000)
DB_POOL_TIMEOUT = config.seconds("DB_POOL_TIMEOUT", 10.0, maximum=600)
DATABASES = {"default": env.db_url_config(DATABASE_URL or f"sqlite:///{DATA_DIR / 'sagaplane.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL journal and a busy timeout let the web process and the Celery worker share the file.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }
    # Tests on SQLite use a file, not Django's shared in-memory database: in memory, every thread of
    # a live test server shares the test's one connection, so a long-poll still running after its
    # test (it re-reads every second for up to 25 s) interleaved its queries with the next test's
    # savepoints. A file gives each thread its own connection, as in production.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test-sagaplane.sqlite3")}
else:
    # Django's backend, plus a bound a call may set on its wait for a pooled connection (the gate
    # answers within a second, refusing, when the database is unreachable: core/availability.py).
    DATABASES["default"]["ENGINE"] = "controlplane.postgres"
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # with the pool, "close" returns it to the pool
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # A server that does not answer (a dropped route, not a refused port) fails a connection attempt
    # after this long, not the operating system's minutes.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", 5)
    if DB_POOL:
        DATABASES["default"]["OPTIONS"]["pool"] = {
            "min_size": 1,
            "max_size": DB_POOL_MAX_SIZE,
            "timeout": DB_POOL_TIMEOUT,
            # A failed reconnection is given up after this long and retried when a request asks,
            # rather than retried with backoff for five minutes (psycopg's default): after an outage
            # the first request then connects at once instead of waiting for the next retry.
            "reconnect_timeout": 0.5,
        }
# The role the owner grants table access to after each migrate (core.rls.install).
DATABASE_RUNTIME_ROLE: str = DATABASES["default"].get("USER", "")
# The owner's credentials, swapped in by core.rls.database_owner() (migrate, test set-up).
DATABASE_OWNER: dict[str, str] | None = None
if DATABASE_OWNER_URL:
    _owner = env.db_url_config(DATABASE_OWNER_URL)
    DATABASE_OWNER = {"USER": _owner["USER"], "PASSWORD": _owner["PASSWORD"]}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Recovery results' server records are chained in batches: a pending one this old is chained, with
# every other, by the next result to commit (audit.services.queue_server_records). Embedded mode
# (no Redis) chains each at once, in the process that accepted it: its live layer is in memory,
# per process, and what the beat's process chained would never reach an open timeline.
EVIDENCE_GROUP_WINDOW_S = 0.2 if REDIS_URL else 0.0

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
    CELERY_BROKER_TRANSPORT = "controlplane.broker:Transport"  # whole messages only (see there)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "data_folder_processed": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
    }
CELERY_TASK_ALWAYS_EAGER = config.boolean("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None
# Workers log through settings.LOGGING (JSON in production) instead of Celery's own root handler.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE: dict = {
    # A checkpoint follows acceptance within about a second (ARCHITECTURE §2.3).
    # A tick that waited behind busy workers is dropped when they get to it, not run late.
    "transparency-integrate": {
        "task": "transparency.integrate_grown_tenants",
        "schedule": 1.0,
        "options": {"expires": 5.0},
    },
    # An export whose worker died mid-build is re-queued, then failed after a few attempts.
    "transparency-export-sweep": {
        "task": "transparency.sweep_stale_exports",
        "schedule": config.seconds("SAGAPLANE_EXPORT_SWEEP_SECONDS", 60.0, maximum=24 * 3600),
    },
    # Recovery's sweep (expired leases taken over, stuck jobs escalated, webhooks woken) is not
    # here: a tick queued behind busy workers expired unrun. It is a thread of the beat process
    # (recovery/sweeper.py, started on beat_init by recovery/apps.py), and workers' claims take over too.
    # The gate's refusals are kept 30 days for the dashboard; allows (the ledger) forever. Budget
    # leases' uses a day once their lease is returned or settled (nothing reads them then).
    "fleet-prune-old-rows": {
        "task": "fleet.prune_old_rows",
        "schedule": 3600.0,
        "options": {"expires": 600.0},
    },
    # Approval deadlines (expiry denies; the gate and the long-poll already treat a request past its
    # deadline as expired, this records it), warnings before them, escalation, lapsed approvals.
    "approvals-sweep": {"task": "approvals.sweep", "schedule": 5.0, "options": {"expires": 10.0}},
    # Reconciliation: compensated steps become checks for their observers; overdue checks are
    # unverifiable. Ticks that waited behind busy workers expire rather than pile up.
    "reconciliation-pass": {
        "task": "reconciliation.reconcile",
        "schedule": config.seconds("SAGAPLANE_RECONCILE_SECONDS", 2.0, maximum=3600),
        "options": {"expires": 10.0},
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Passkeys (WebAuthn, passkeys/): the relying party id is the dashboard's host name (a passkey
# works on that name and the names under it); the origins are the exact addresses the dashboard is
# served from. With none configured, a ceremony may come from the address the request reached when
# its host is the RP id or under it (development on localhost at any port).
SAGAPLANE_WEBAUTHN_RP_ID = config.text(
    "SAGAPLANE_WEBAUTHN_RP_ID",
    "localhost",
    pattern=re.compile(r"[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?"),
    must="a host name such as sagaplane.example.com (lower case, no scheme or port)",
)
SAGAPLANE_WEBAUTHN_RP_NAME = config.text(
    "SAGAPLANE_WEBAUTHN_RP_NAME", "Sagaplane", pattern=re.compile(r"\S(?:.{0,98}\S)?"), must="a name"
)
SAGAPLANE_WEBAUTHN_ORIGINS = config.origins("SAGAPLANE_WEBAUTHN_ORIGINS", [])
if PRODUCTION:  # passkeys bound to localhost, or to a site this deployment is not, would never work
    _insecure += config.relying_party(SAGAPLANE_WEBAUTHN_RP_ID, SAGAPLANE_WEBAUTHN_ORIGINS, ALLOWED_HOSTS)
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
# Signing out lands on the sign-in page (Django's default is the admin's "Logged out" page).
LOGOUT_REDIRECT_URL = "login"

# Sign-in throttling (django-axes, attempts stored in the database). Failures are counted per
# account (from any address) and per client address (across accounts), each on its own: either
# reaching the limit refuses every sign-in it covers, the right password included, until the
# cool-off has passed since the last failure. A refused sign-in checks no password, so it is not
# a failure and does not extend the lockout (a person retrying is not punished for it). A success
# does not reset the counts, or one valid account would let an address guess at all the others.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out sign-in before checking it
    "django.contrib.auth.backends.ModelBackend",
]
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_FAILURE_LIMIT = config.integer("SAGAPLANE_SIGNIN_FAILURE_LIMIT", 10, minimum=1, maximum=1000)
AXES_COOLOFF_TIME = timedelta(
    minutes=config.integer("SAGAPLANE_SIGNIN_COOLOFF_MINUTES", 15, minimum=1, maximum=7 * 24 * 60)
)
AXES_RESET_ON_SUCCESS = False
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_USERNAME_CALLABLE = "frontend.signin.attempted_username"
AXES_LOCKOUT_CALLABLE = "frontend.signin.locked_out_response"
AXES_DISABLE_ACCESS_LOG = True  # successful sign-ins are not kept: a table that would only grow
# The client address is REMOTE_ADDR: behind a proxy, the server must set it from the proxy's
# header (uvicorn --proxy-headers --forwarded-allow-ips=<proxy>), or every client shares one.
AXES_IPWARE_META_PRECEDENCE_ORDER = ("REMOTE_ADDR",)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = config.directory("STATIC_ROOT", DATA_DIR / "static")
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
    "DEFAULT_PAGINATION_CLASS": "controlplane.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "core.errors.api_exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "controlplane.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
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
    # `<id:...>` (core.numbers.IdConverter): an integer id of at most 18 ASCII digits.
    "PATH_CONVERTER_OVERRIDES": {"id": {"type": "integer", "minimum": 0, "maximum": 10**18 - 1}},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        # Every operation documents its error answers in the one shape (controlplane/schema.py).
        "controlplane.schema.add_error_responses",
    ],
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
_ssl_redirect = config.boolean("SECURE_SSL_REDIRECT", default=True)
_hsts_seconds = config.integer("SECURE_HSTS_SECONDS", 31536000, minimum=0)
if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = _ssl_redirect
    # Probes inside the cluster speak plain http to the pod; redirecting them fails every probe.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = _hsts_seconds
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

LOG_LEVEL = config.choice("LOG_LEVEL", ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], default="INFO")
# json: one object per line with time, level, logger, request id, tenant, actor and trace id
# (controlplane/logs.py), the production default; text: the message alone, for a terminal.
LOG_FORMAT = config.choice("SAGAPLANE_LOG_FORMAT", ["json", "text"], default="json" if PRODUCTION else "text")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Invitation tokens in request paths are credentials: written as references (frontend.log_redaction).
    "filters": {"invitation_tokens": {"()": "frontend.log_redaction.RedactInvitationTokens"}},
    "formatters": {"json": {"()": "controlplane.logs.json_formatter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["invitation_tokens"],
            **({"formatter": "json"} if LOG_FORMAT == "json" else {}),
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# Outgoing mail (invitations): EMAIL_URL such as smtp+tls://user:pass@host:587; the console otherwise.
_email_schemes = tuple(environ.Env.EMAIL_SCHEMES)
globals().update(  # EMAIL_BACKEND, EMAIL_HOST, ...
    env.email_url_config(
        config.url("EMAIL_URL", _email_schemes, default="consolemail://") or "consolemail://"
    )
)
DEFAULT_FROM_EMAIL = config.email_address("DEFAULT_FROM_EMAIL", "Sagaplane <no-reply@sagaplane.local>")

# Ingest limits: a batch over either is refused whole with 413.
SAGAPLANE_MAX_BATCH_RECORDS = config.integer(
    "SAGAPLANE_MAX_BATCH_RECORDS", 5000, minimum=1, maximum=1_000_000
)
SAGAPLANE_MAX_BODY_BYTES = config.integer(
    "SAGAPLANE_MAX_BODY_BYTES", 8 * 1024 * 1024, minimum=1024, maximum=1024 * 1024 * 1024
)
DATA_UPLOAD_MAX_MEMORY_SIZE = SAGAPLANE_MAX_BODY_BYTES

# Transparency log: checkpoint origin (and key name) is f"{prefix}/{tenant slug}"; exports are
# write-once files under the data folder unless a backend with a retention lock is configured.
SAGAPLANE_LOG_ORIGIN_PREFIX = config.text(
    "SAGAPLANE_LOG_ORIGIN_PREFIX",
    "sagaplane.local",
    pattern=re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._~:/-]*[A-Za-z0-9])?"),
    must="a schema-less name such as sagaplane.example.com or example.com/log (letters, digits, . _ ~ : / -)",
)
SAGAPLANE_EXPORT_STORAGE = {
    "BACKEND": config.dotted_path(
        "SAGAPLANE_EXPORT_STORAGE_BACKEND",
        "transparency.storage.WriteOnceFileStorage",
        what="a storage class",
    ),
    "OPTIONS": {
        "location": config.text(
            "SAGAPLANE_EXPORT_DIR",
            str(DATA_DIR / "exports"),
            pattern=re.compile(r"\S(?:.*\S)?"),
            must="a folder path or storage location",
        )
    },
}
# Object storage (transparency/storage.py WriteOnceS3Storage): AWS S3 or any server speaking its
# API. The bucket, endpoint and region are django-storages' settings; credentials come from boto3's
# own chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, an instance role), never from here.
AWS_STORAGE_BUCKET_NAME = config.text(
    "SAGAPLANE_OBJECT_BUCKET",
    "",
    pattern=re.compile(r"|[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"),
    must="an S3 bucket name",
)
AWS_S3_ENDPOINT_URL = config.url("AWS_S3_ENDPOINT_URL", ("https", "http")) or None
AWS_S3_REGION_NAME = config.text("AWS_S3_REGION_NAME", "") or None
AWS_S3_FILE_OVERWRITE = False
_S3_BACKEND = "transparency.storage.WriteOnceS3Storage"
if SAGAPLANE_EXPORT_STORAGE["BACKEND"] == _S3_BACKEND:
    # Exports under an Object Lock in compliance mode for this many days (0: write-once only).
    _export_options: dict = SAGAPLANE_EXPORT_STORAGE["OPTIONS"]  # type: ignore[assignment]
    _export_options["retention_days"] = config.integer(
        "SAGAPLANE_EXPORT_RETENTION_DAYS", 0, minimum=0, maximum=100 * 365
    )
# Full tiles (and full entry bundles) published once each to object storage, from which a CDN can
# serve them (they never change); off unless a backend is named.
SAGAPLANE_TILE_STORAGE: dict = {}
if config.environ.get("SAGAPLANE_TILE_STORAGE_BACKEND"):
    SAGAPLANE_TILE_STORAGE = {
        "BACKEND": config.dotted_path("SAGAPLANE_TILE_STORAGE_BACKEND", _S3_BACKEND, what="a storage class"),
        "OPTIONS": {
            "location": config.text(
                "SAGAPLANE_TILE_PREFIX", "tiles", pattern=re.compile(r"\S(?:.*\S)?"), must="a key prefix"
            )
        },
    }
    if SAGAPLANE_TILE_STORAGE["BACKEND"] == _S3_BACKEND:
        SAGAPLANE_TILE_STORAGE["OPTIONS"]["cache_control"] = "public, max-age=31536000, immutable"
if _S3_BACKEND in (SAGAPLANE_EXPORT_STORAGE["BACKEND"], SAGAPLANE_TILE_STORAGE.get("BACKEND")) and not (
    AWS_STORAGE_BUCKET_NAME
):
    config.refuse("SAGAPLANE_OBJECT_BUCKET", f"set when a storage backend is {_S3_BACKEND}")
# One integration transaction appends at most this many leaves (and signs a checkpoint); a worker
# asked to shut down stops between two, so this also bounds how long a warm shutdown waits.
SAGAPLANE_INTEGRATION_CHUNK_LEAVES = config.integer(
    "SAGAPLANE_INTEGRATION_CHUNK_LEAVES", 50_000, minimum=1, maximum=1_000_000
)
# An unfinished export with no progress for this long is presumed dead and re-queued; after this
# many builds have died it is marked failed with the reason.
SAGAPLANE_EXPORT_STALE_MINUTES = config.integer(
    "SAGAPLANE_EXPORT_STALE_MINUTES", 10, minimum=1, maximum=7 * 24 * 60
)
SAGAPLANE_EXPORT_MAX_ATTEMPTS = config.integer("SAGAPLANE_EXPORT_MAX_ATTEMPTS", 3, minimum=1, maximum=100)

# /metrics (controlplane/observability.py): answered only to a scrape bearing this token
# (`Authorization: Bearer ...`); without one, in development only. Never echoed.
SAGAPLANE_METRICS_TOKEN = config.environ.get("SAGAPLANE_METRICS_TOKEN", "")
if SAGAPLANE_METRICS_TOKEN and (
    len(SAGAPLANE_METRICS_TOKEN) < 24 or any(ch.isspace() for ch in SAGAPLANE_METRICS_TOKEN)
):
    config.refuse("SAGAPLANE_METRICS_TOKEN", "at least 24 characters without spaces", secret=True)

# Reconciliation (reconciliation/): a compensated step is offered to its observers after DELAY
# (the external system may take a moment to show a refund); nobody answering within WINDOW makes
# it unverifiable; a claimed check is re-offered when its LEASE lapses without an answer.
SAGAPLANE_RECONCILE_DELAY_SECONDS = config.integer(
    "SAGAPLANE_RECONCILE_DELAY_SECONDS", 5, minimum=0, maximum=86400
)
SAGAPLANE_RECONCILE_WINDOW_SECONDS = config.seconds(
    "SAGAPLANE_RECONCILE_WINDOW_SECONDS", 300.0, maximum=30 * 86400
)
SAGAPLANE_RECONCILE_LEASE_SECONDS = config.seconds("SAGAPLANE_RECONCILE_LEASE_SECONDS", 30.0, maximum=3600)

# Webhooks (recovery deliveries, reconciliation checks) go to public addresses only: a tenant's URL
# resolving to loopback, private, link-local (cloud metadata), multicast or reserved space is
# refused when it is set and at each delivery (recovery/webhook.py). On by default outside
# production, where the receiver is usually on this machine.
SAGAPLANE_WEBHOOK_ALLOW_PRIVATE = config.boolean("SAGAPLANE_WEBHOOK_ALLOW_PRIVATE", default=not PRODUCTION)

# Recovery: a worker-delivered job that no worker claims within this long after it became
# claimable (no SDK worker has its handler, and no webhook takes it) escalates to the human queue
# as "no handler".
SAGAPLANE_RECOVERY_UNCLAIMED_SECONDS = config.seconds(
    "SAGAPLANE_RECOVERY_UNCLAIMED_SECONDS", 300.0, maximum=30 * 86400
)

# Where people reach this control plane: links in messages sent from workers, which have no
# request to build them from (Slack's "Approve with passkey", its account-link page).
SAGAPLANE_PUBLIC_URL = config.url("SAGAPLANE_PUBLIC_URL", ("https", "http"), default="http://localhost:8000")
if PRODUCTION and not SAGAPLANE_PUBLIC_URL.startswith("https://"):
    _insecure.append("SAGAPLANE_PUBLIC_URL is not an https:// URL")

# Slack (slackapp/): the app's credentials from its configuration page. Without a signing secret
# every /slack/ request is refused (nothing can be verified); without the client id and secret
# nothing can be installed. SLACK_API_URL is the Web API's base (tests point it at a local server
# that speaks the same wire format); the OAuth consent page is on the same origin.
SLACK_CLIENT_ID = config.text("SLACK_CLIENT_ID", "")
SLACK_CLIENT_SECRET = config.text("SLACK_CLIENT_SECRET", "")
SLACK_SIGNING_SECRET = config.text("SLACK_SIGNING_SECRET", "")
SLACK_API_URL = config.url("SLACK_API_URL", ("https", "http"), default="https://slack.com/api/") or (
    "https://slack.com/api/"
)
if not SLACK_API_URL.endswith("/"):
    SLACK_API_URL += "/"  # WebClient appends the method name to it
if PRODUCTION and not SLACK_API_URL.startswith("https://"):
    _insecure.append("SLACK_API_URL is not an https:// URL")

# The last word: refuse to start while any variable above is malformed (every mode) or, in
# production, any setting keeps an insecure default. Each problem is named at once.
config.finish(_insecure if PRODUCTION else ())
