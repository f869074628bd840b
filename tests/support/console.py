"""The console's pages, as the owner's navigation reaches them: the accessibility pass runs axe on
each, and the page-time test times each at 10,000 sagas."""

from __future__ import annotations

PAGES = [
    "/sagas/",
    "/fleet/",
    "/fleet/halts/history",
    "/fleet/denials/",
    "/approvals/",
    "/approvals/history/",
    "/approvals/policies/",
    "/recovery/",
    "/reconciliation/",
    "/reconciliation/?show=open",
    "/evidence/",
    "/administration/members/",
    "/account/passkeys/",
    "/administration/keys/",
]
