"""Every state change of approvals, one module per aggregate (policies, requests, votes, the sweep,
the gate's step); `approvals.services` is their public face for other apps."""
