"""Every state change of the evidence store, one module per concern. Nothing else writes `audit`
tables.

- `ingest.ingest(tenant, stream_id, records, actor=...)`: verify a batch against the stream's
  stored head and append it whole, or refuse it whole (`IngestRefused`, store unchanged except for
  the evidence row of an equivocation attempt).
- `ingest.ingest_by_linkage(tenant, records, actor=...)`: agent-saga's `/v1/wal/ingest`, whose
  records name no stream: each chain segment is attached where its first record links
  (ARCHITECTURE §3).
- `server_stream.append_server_record(tenant, event, fields, actor=...)`: the tenant's own server
  stream, for admin actions, approvals and redactions, in the caller's transaction.
- `erasure.redact(tenant, stream_id, ..., reason, actor)`: erasure of a payload, recorded in the
  server stream.

One chain rule for SDK and server: the hashing and the walk are `sagaplane.chain`'s
(`ChainWalk`, the walk `verify_chain` runs: same reasons, same first bad record);
`verification.plan_batch` adds only what the server knows, the records it already holds.

Modules: `parsing` (a batch type-checked), `verification` (the walk from the stored head),
`storage` (the append under the locks), `ingest` (writers' batches, refusals kept as evidence),
`server_stream` (the server's own records, appended or queued), `erasure` (redaction, a stored
record in WAL form), `common` (the refusal, the result). Other apps call them through
`audit.services`. Each asserts the tenant's scope (`core.scoping.require_tenant`): the transport
entered it (the ingest views; `audit.tasks` for the server records chained after a commit or by
a sweep, one transaction as the tenant per batch).
"""
