"""Names vulture (`make lint`) cannot see used: framework entry points, stored model fields and
protocol signatures. Code nothing uses is deleted, not listed here.

Never imported or run: vulture reads it ([tool.vulture] in pyproject.toml; ruff and mypy skip it)."""

# Django app configs (INSTALLED_APPS) and their attributes.
ApprovalsConfig  # unused class (approvals/apps.py:4)
FleetConfig  # unused class (fleet/apps.py:4)
RecoveryConfig  # unused class (recovery/apps.py:4)
SlackappConfig  # unused class (slackapp/apps.py:4)
verbose_name  # unused variable (slackapp/apps.py:7)
AuditConfig  # unused class (audit/apps.py:4)
default_auto_field  # unused variable (audit/apps.py:6)
FrontendConfig  # unused class (frontend/apps.py:4)
PasskeysConfig  # unused class (passkeys/apps.py:4)
ReconciliationConfig  # unused class (reconciliation/apps.py:4)
SagasConfig  # unused class (sagas/apps.py:4)
TenantsConfig  # unused class (tenants/apps.py:5)
TransparencyConfig  # unused class (transparency/apps.py:4)

# DRF calls a field's run_validation (core.inputs: the strict fields of a command's input).
run_validation  # unused method (core/inputs.py)

# Django models: Meta options and fields (columns read by SQL, serializers, templates, the admin; Model._state).
_.adding  # unused attribute (audit/queries.py)
output_field  # unused variable (audit/models.py:35)
Meta  # unused class (audit/models.py:49)
constraints  # unused variable (audit/models.py:50)
indexes  # unused variable (audit/models.py:71)
leaf_block  # unused variable (audit/models.py:115)
policy_pk  # unused variable (approvals/models.py:57: written by keyword, filtered by name)
settler  # unused variable (fleet/models.py: GateLease, the lease settlement claim's holder column, set by core.claims)
backed_up  # unused variable (passkeys/models.py:46)
compensated_leaf  # unused variable (reconciliation/models.py:57)
available_at  # unused variable (recovery/models.py:129): read by name in the claims' ORDER BY (core.claims sorts by it)
not_before  # unused variable (reconciliation/models.py:67)
lease_until  # unused variable (slackapp/models.py:95): the lease's column, named to core.claims
_.not_before  # unused attribute (reconciliation/services.py:499)
accepted_at  # unused variable (tenants/models.py:76)
abstract  # unused variable (core/scoping.py:250)
retired_at  # unused variable (transparency/models.py:44)
cosigned_checkpoint  # unused variable (transparency/models.py:179)

# Django URLconfs: `urlpatterns`, read by the resolver.
urlpatterns  # unused variable (audit/compat_urls.py:8)

# Django form fields and template context attributes (templates are not scanned).
refused_count  # unused variable (audit/selectors.py:51)
expires_in_days  # unused variable (frontend/admin_views.py:39)
password_again  # unused variable (frontend/admin_views.py:44)
_.rollback_here  # unused attribute (frontend/recovery_views.py:162)
chain_hash  # unused variable (frontend/saga_views.py:263)
rollback_here  # unused variable (frontend/saga_views.py:280)
_.outcome_label  # unused property (frontend/saga_views.py:282)
_.rollback_warning  # unused attribute (frontend/recovery_views.py:184)
rollback_warning  # unused variable (frontend/saga_views.py:276)
_.duration  # unused attribute (frontend/saga_story.py:65)
duration  # unused variable (frontend/saga_views.py:281)

# Hooks named in settings (MIDDLEWARE, LOGGING, AXES_*) or called by a library (a Prometheus collector).
ErrorShapeMiddleware  # unused class (core/errors.py:213)
_.process_exception  # unused method (core/errors.py:228)
json_formatter  # unused function (controlplane/logs.py:44)
RequestObservabilityMiddleware  # unused class (controlplane/observability.py:132)
_.collect  # unused method (controlplane/observability.py:214)
attempted_username  # unused function (frontend/signin.py:19)
locked_out_response  # unused function (frontend/signin.py:32)
TenantContextResetMiddleware  # unused class (core/scoping.py:273)
RequestConnectionWait  # a middleware (core/availability.py), named in settings.MIDDLEWARE

# Django path converter methods.
_.to_python  # unused method (core/numbers.py:42)
_.to_url  # unused method (core/numbers.py:45)

# DRF and drf-spectacular: serializer Meta, get_<field> methods, pagination, parser, authentication and schema hooks named in settings or called by the framework.
BoundedLimitOffsetPagination  # unused class (controlplane/pagination.py:15)
max_limit  # unused variable (controlplane/pagination.py:16)
media_type  # unused variable (controlplane/parsers.py:57)
add_error_responses  # unused function (controlplane/schema.py:63)
generator  # unused variable (controlplane/schema.py:63)
recorded_status  # unused variable (sagas/api.py:31)
Meta  # unused class (sagas/api.py:33)
_.get_status  # unused method (sagas/api.py:53)
_.paginate_queryset  # unused method (sagas/api.py:100)
_.get_paginated_response  # unused method (sagas/api.py:118)
_.get_paginated_response_schema  # unused method (sagas/api.py:121)
_.get_schema_operation_parameters  # unused method (sagas/api.py:131)
serializer_class  # unused variable (sagas/api.py:147)
pagination_class  # unused variable (sagas/api.py:148)
read_only_fields  # unused variable (tenants/api.py:56)
_.destroy  # unused method (tenants/api.py:91)
is_staff  # unused variable (tenants/authentication.py:150)
is_superuser  # unused variable (tenants/authentication.py:151)
is_anonymous  # unused variable (tenants/authentication.py:152)
ApiKeyAuthentication  # unused class (tenants/authentication.py:164)
_.authenticate  # unused method (tenants/authentication.py:167)
_.authenticate_header  # unused method (tenants/authentication.py:177)
ApiKeyAuthenticationScheme  # unused class (tenants/schema.py:8)
target_class  # unused variable (tenants/schema.py:9)
_.get_security_definition  # unused method (tenants/schema.py:12)
auto_schema  # unused variable (tenants/schema.py:12)

# Django settings: read by name by Django and the libraries it configures.
LOGOUT_REDIRECT_URL  # unused variable (controlplane/settings.py:304)
SECURE_SSL_REDIRECT  # unused variable (controlplane/settings.py:404)
SECURE_PROXY_SSL_HEADER  # unused variable (controlplane/settings.py:407)
CSRF_TRUSTED_ORIGINS  # unused variable (controlplane/settings.py:85)
INSTALLED_APPS  # unused variable (controlplane/settings.py:97)
ROOT_URLCONF  # unused variable (controlplane/settings.py:148)
WSGI_APPLICATION  # unused variable (controlplane/settings.py:149)
ASGI_APPLICATION  # unused variable (controlplane/settings.py:150)
TEMPLATES  # unused variable (controlplane/settings.py:152)
DEFAULT_AUTO_FIELD  # unused variable (controlplane/settings.py:214)
CACHES  # unused variable (controlplane/settings.py:223)
CHANNEL_LAYERS  # unused variable (controlplane/settings.py:224)
CELERY_BROKER_URL  # unused variable (controlplane/settings.py:227)
CELERY_BROKER_TRANSPORT_OPTIONS  # unused variable (controlplane/settings.py:228)
CELERY_BROKER_TRANSPORT  # unused variable (controlplane/settings.py:236)
CELERY_TASK_ALWAYS_EAGER  # unused variable (controlplane/settings.py:242)
CELERY_TASK_ACKS_LATE  # unused variable (controlplane/settings.py:243)
CELERY_WORKER_PREFETCH_MULTIPLIER  # unused variable (controlplane/settings.py:244)
CELERY_TASK_SERIALIZER  # unused variable (controlplane/settings.py:245)
CELERY_ACCEPT_CONTENT  # unused variable (controlplane/settings.py:246)
CELERY_RESULT_BACKEND  # unused variable (controlplane/settings.py:247)
CELERY_WORKER_HIJACK_ROOT_LOGGER  # unused variable (controlplane/settings.py:249)
CELERY_BEAT_SCHEDULE_FILENAME  # unused variable (controlplane/settings.py:250)
AUTH_PASSWORD_VALIDATORS  # unused variable (controlplane/settings.py:281)
LOGIN_URL  # unused variable (controlplane/settings.py:301)
AUTHENTICATION_BACKENDS  # unused variable (controlplane/settings.py:310)
AXES_LOCKOUT_PARAMETERS  # unused variable (controlplane/settings.py:314)
AXES_FAILURE_LIMIT  # unused variable (controlplane/settings.py:315)
AXES_RESET_ON_SUCCESS  # unused variable (controlplane/settings.py:319)
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT  # unused variable (controlplane/settings.py:320)
AXES_USERNAME_CALLABLE  # unused variable (controlplane/settings.py:321)
AXES_LOCKOUT_CALLABLE  # unused variable (controlplane/settings.py:322)
AXES_DISABLE_ACCESS_LOG  # unused variable (controlplane/settings.py:323)
AXES_IPWARE_META_PRECEDENCE_ORDER  # unused variable (controlplane/settings.py:326)
LANGUAGE_CODE  # unused variable (controlplane/settings.py:328)
TIME_ZONE  # unused variable (controlplane/settings.py:329)
USE_I18N  # unused variable (controlplane/settings.py:330)
USE_TZ  # unused variable (controlplane/settings.py:331)
STATIC_URL  # unused variable (controlplane/settings.py:333)
STATIC_ROOT  # unused variable (controlplane/settings.py:334)
STORAGES  # unused variable (controlplane/settings.py:335)
WHITENOISE_USE_FINDERS  # unused variable (controlplane/settings.py:343)
REST_FRAMEWORK  # unused variable (controlplane/settings.py:345)
SPECTACULAR_SETTINGS  # unused variable (controlplane/settings.py:362)
CONTENT_SECURITY_POLICY  # unused variable (controlplane/settings.py:380)
SESSION_COOKIE_HTTPONLY  # unused variable (controlplane/settings.py:393)
CSRF_COOKIE_HTTPONLY  # unused variable (controlplane/settings.py:394)
SECURE_CONTENT_TYPE_NOSNIFF  # unused variable (controlplane/settings.py:395)
X_FRAME_OPTIONS  # unused variable (controlplane/settings.py:396)
SESSION_COOKIE_SECURE  # unused variable (controlplane/settings.py:400)
CSRF_COOKIE_SECURE  # unused variable (controlplane/settings.py:401)
SECURE_REDIRECT_EXEMPT  # unused variable (controlplane/settings.py:404)
SECURE_HSTS_SECONDS  # unused variable (controlplane/settings.py:406)
SECURE_HSTS_INCLUDE_SUBDOMAINS  # unused variable (controlplane/settings.py:407)
SECURE_HSTS_PRELOAD  # unused variable (controlplane/settings.py:408)
LOGGING  # unused variable (controlplane/settings.py:414)
DEFAULT_FROM_EMAIL  # unused variable (controlplane/settings.py:438)
DATA_UPLOAD_MAX_MEMORY_SIZE  # unused variable (controlplane/settings.py:447)
AWS_S3_ENDPOINT_URL  # unused variable (controlplane/settings.py:481)
AWS_S3_REGION_NAME  # unused variable (controlplane/settings.py:482)
AWS_S3_FILE_OVERWRITE  # unused variable (controlplane/settings.py:483)

# Migration operations: used by migrations (excluded from the scan).
analyze_sooner  # unused function (core/statistics.py:15)
unindex_tenant  # unused function (core/statistics.py:37)

# Django Channels consumer handlers, dispatched by event type.
bytes_data  # unused variable (sagas/consumers.py:107)
_.live_revoke  # unused method (sagas/consumers.py:119)
_.approval_event  # unused method (sagas/consumers.py:122)

# Django management commands: `add_arguments` is called by the command runner.
_.add_arguments  # unused method (sagas/management/commands/rebuild_sagas.py:16)

# SDK overrides of library hooks (pydantic config, MCP server, Starlette, uvicorn, http.server).
model_config  # unused variable (sdk/sagaplane/integrations/langgraph.py:278)
_.get_capabilities  # unused method (sdk/sagaplane/integrations/mcp_gateway.py:208)
_.middleware  # unused attribute (sdk/sagaplane/integrations/mcp_gateway.py:291)
_.capture_signals  # unused method (sdk/sagaplane/integrations/mcp_gateway.py:564)
protocol_version  # unused variable (sdk/sagaplane/witnesscli.py:32)
disable_nagle_algorithm  # unused variable (sdk/sagaplane/witnesscli.py:35)
server_version  # unused variable (sdk/sagaplane/witnesscli.py:36)
_.log_message  # unused method (sdk/sagaplane/witnesscli.py:39)
_.close_connection  # unused attribute (sdk/sagaplane/witnesscli.py:57)
_.do_GET  # unused method (sdk/sagaplane/witnesscli.py:69)
_.daemon_threads  # unused attribute (sdk/sagaplane/witnesscli.py:80)

# Django admin options.
list_display  # unused variable (tenants/admin.py:8)
search_fields  # unused variable (tenants/admin.py:9)

# Tests: overrides of library hooks (http.server, langchain, openai-agents, psycopg), settings set by
# fixtures, fixtures asked for their effect, a class defined for its class-creation check.
_.PASSWORD_HASHERS  # unused attribute (tests/conftest.py:185)
database_gate_store  # unused variable (tests/controlplane/test_metrics.py:89)
_.AXES_FAILURE_LIMIT  # unused attribute (tests/frontend/test_signin_throttle.py:24)
pool_for_every_thread  # unused variable (tests/hostile/test_inputs.py:211)
_.log_message  # unused method (tests/hostile/test_inputs.py:376)
_.row_factory  # unused attribute (tests/recovery/live.py:264)
do_GET  # unused variable (tests/recovery/test_webhook_guard.py:55)
_._llm_type  # unused property (tests/sdk/lg_agent.py:102)
_.bind_tools  # unused method (tests/sdk/lg_agent.py:106)
_._generate  # unused method (tests/sdk/lg_agent.py:109)
run_manager  # unused variable (tests/sdk/lg_agent.py:110)
_.do_GET  # unused method (tests/sdk/sagaplane_testkit.py:41)
system_instructions  # unused variable (tests/sdk/test_integrations_openai_agents.py:85)
_.stream_response  # unused method (tests/sdk/test_integrations_openai_agents.py:121)
_.protocol_version  # unused attribute (tests/sdk/test_sdk_shipper.py:477)
daemon_threads  # unused variable (tests/slackapp/slack_server.py:299)
Forgetful  # unused class (tests/tenants/test_access_table.py:614)
unreachable_broker  # unused variable (tests/transparency/test_export_recovery.py:439)
_.SECURE_PROXY_SSL_HEADER  # unused attribute (tests/fleet/test_gate_lean.py:262)
_.AWS_S3_ENDPOINT_URL  # unused attribute (tests/transparency/test_object_storage.py:55)
_.AWS_S3_REGION_NAME  # unused attribute (tests/transparency/test_object_storage.py:57)


# Stored facts: model fields written when something happens and read by the admin, templates,
# exports and operators' SQL (vulture sees only Python reads); enum members that are valid
# stored values.
requester_user  # unused variable (approvals/models.py:88)
used_at  # unused variable (approvals/models.py:153)
DRAIN  # unused variable (fleet/models.py:72)
lifted_by  # unused variable (fleet/models.py:85)
_.lifted_by  # unused attribute (fleet/actions/halts.py:77)
released_at  # unused variable (fleet/models.py:98)
PENDING_APPROVAL  # unused variable (fleet/models.py:109)
returned_at  # unused variable (fleet/models.py:208): when a lease was given back (the ledger row's own record)
_.returned_at  # unused attribute (fleet/actions/leases.py:227)
step_status  # unused variable (recovery/models.py:118)
first_claimed_at  # unused variable (recovery/models.py:131)
escalated_at  # unused variable (recovery/models.py:135)
_.escalated_at  # unused attribute (recovery/actions/runs.py:237)
took_s  # unused variable (recovery/models.py:169)
linked_at  # unused variable (slackapp/models.py:66)
posted_at  # unused variable (slackapp/models.py:83)

# Framework and protocol hooks: Django's HttpRequest._get_scheme (the gate's request), a
# middleware named in settings.MIDDLEWARE, slack-sdk's InstallationStore interface, the context
# manager protocol's arguments.
_._get_scheme  # unused method (controlplane/gate_asgi.py:84)
LeanProofMiddleware  # unused class (transparency/lean.py:63)
_.save_bot  # unused method (slackapp/actions/installations.py:96)
bot  # unused variable (slackapp/actions/installations.py:96)
_.find_bot  # unused method (slackapp/actions/installations.py:104)
is_enterprise_install  # unused variable (slackapp/actions/installations.py:105)
_.delete_bot  # unused method (slackapp/actions/installations.py:134)
et  # unused variable (sdk/sagaplane/saga.py:254)
tb  # unused variable (sdk/sagaplane/saga.py:254)

# Dataclass fields templates read.
examples  # unused variable (approvals/selectors.py:109: the policy preview's template)

# html.parser.HTMLParser calls its subclass' handlers (a test reads a rendered form as a browser posts it).
handle_starttag  # unused method (tests/frontend/test_policy_builder_groups.py)
handle_endtag  # unused method (tests/frontend/test_policy_builder_groups.py)
handler500  # the URLconf's error view (controlplane/urls.py), read by Django
