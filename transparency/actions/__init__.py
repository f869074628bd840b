"""Every state change of the transparency log, one module per concern; each is one function and
one transaction.

The invariant they protect: no two signed checkpoints of a tenant are inconsistent. `integration`
proves consistency with the last signed checkpoint (re-reading that checkpoint from its signed
note, not from a column) with `merkle.verify_consistency` *before* it signs, under a row lock on
`TreeState`; any disagreement between stored state, stored nodes and the last note refuses.

Modules: `signing` (the tenant's keys, signers and verifiers), `rotation` (key rotation),
`integration` (extend the tree, sign a checkpoint), `seals` (the seal pass and its watermark),
`exports` (WORM exports: request, build, the stale sweep), `common` (the refusal, the locked state
rows). Other apps call them through `transparency.services`.
"""
