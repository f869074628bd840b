"""The transparency log's public surface: the actions other apps, the API, the tasks and the
commands call. The actions themselves live in `transparency.actions` (one module per concern; its
docstring tells the invariant); this module only re-exports them, so callers have one stable
place to import from."""

from __future__ import annotations

from transparency.actions.common import IntegrationRefused
from transparency.actions.exports import (
    ExportClaim,
    claim_export,
    export_storage_name,
    fail_unclaimed_export,
    finish_export,
    record_export_download,
    record_export_progress,
    request_export,
    requeue_or_fail_export,
    stale_exports,
)
from transparency.actions.integration import integrate, integrate_round, tenants_to_integrate
from transparency.actions.rotation import finish_key_rotation, rotate_signing_key
from transparency.actions.seals import SEAL_EVENT, exact_saga_id, seal_pass, tenants_to_seal
from transparency.actions.signing import (
    current_verifier_keys,
    ensure_signing_key,
    log_origin,
    sign_statement,
    verifiers,
)

__all__ = [
    "SEAL_EVENT",
    "IntegrationRefused",
    "ExportClaim",
    "claim_export",
    "current_verifier_keys",
    "ensure_signing_key",
    "exact_saga_id",
    "export_storage_name",
    "fail_unclaimed_export",
    "finish_export",
    "finish_key_rotation",
    "integrate",
    "integrate_round",
    "log_origin",
    "record_export_download",
    "record_export_progress",
    "request_export",
    "requeue_or_fail_export",
    "rotate_signing_key",
    "seal_pass",
    "sign_statement",
    "stale_exports",
    "tenants_to_integrate",
    "tenants_to_seal",
    "verifiers",
]
