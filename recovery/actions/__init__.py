"""Every state change of recovery, one module per concern: the lease watch (in the ingest
transaction), takeover (by the sweep, and by workers' claims: `take_over_batch`), claims and
results of recovery jobs, the human queue's decisions, and "rollback to here".

The database row of a job is the truth: a claim is a conditional UPDATE (the candidate picked with
`FOR UPDATE SKIP LOCKED` on Postgres) that raises the job's `epoch`, its fencing token; a result
is recorded only by the holder of the current token while the job is claimed. Celery (webhook
deliveries) and HTTP long-polls (SDK workers) only wake the claimers.

Every result and decision is appended to the tenant's server stream in the same transaction,
carrying the saga id, so the saga projection shows it and the evidence keeps it:
RECOVERY_STARTED / RECOVERY_ESCALATED (a saga taken over), COMPENSATED / COMPENSATION_FAILED (a
job's result), RECOVERY_RETRY / RECOVERY_RESOLVED / RECOVERY_CANCELLED / RECOVERY_ASSIGNED (a
human's decision) and ROLLBACK_END (a run finished).

Modules: `leases` (the lease watch), `runs` (starting and advancing runs, escalation),
`takeover` (the sweep's parts, takeover on claim), `claims` (claims, heartbeat, token checks),
`results` (completions and failures), `decisions` (people's decisions, rollback to here),
`webhooks` (the tenant's webhook), `common` (limits, the error, readiness). Other apps call them
through `recovery.services`, inside the tenant their transport entered (each asserts it:
`core.scoping.require_tenant`); the sweep's pass over a tenant is `recovery.tasks.sweep_tenant`.
"""
