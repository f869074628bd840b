"""Approvals' public face for other apps, its views and commands: every state change of approvals
(policies, requests, votes, consumption, expiry and escalation) and the shapes they are shown in.
The code lives in `approvals.actions`, one module per aggregate; reads are `approvals.selectors`.

Each change takes a keyword-only `actor` and appends its record (old and new values for policies)
to the tenant's server stream in the same transaction. Every record about a request carries the
saga id, so it is part of that saga's disclosure and counted by its seal.

The gate reaches approvals through `fleet.hooks` (`GateStep`, registered in AppConfig.ready):
fleet never imports approvals.
"""

from __future__ import annotations

from approvals.actions.gate import GateStep
from approvals.actions.policies import (
    create_policy,
    delete_policy,
    policy_values,
    update_policy,
)
from approvals.actions.requests import BUDGET_RULES, request_values, vote_values
from approvals.actions.sweep import sweep
from approvals.actions.votes import challenge_for, check_votable, eligible, issue_vote_challenge, vote
from approvals.inputs import (
    MAX_TTL_S,
    ApprovalVote,
    PolicyChange,
    PolicyCreate,
    PolicyTerms,
    VoteChallengeAsk,
    VoteGlass,
)

__all__ = [
    "BUDGET_RULES",
    "MAX_TTL_S",
    "ApprovalVote",
    "GateStep",
    "PolicyChange",
    "PolicyCreate",
    "PolicyTerms",
    "VoteChallengeAsk",
    "VoteGlass",
    "challenge_for",
    "check_votable",
    "create_policy",
    "delete_policy",
    "eligible",
    "issue_vote_challenge",
    "policy_values",
    "request_values",
    "sweep",
    "update_policy",
    "vote",
    "vote_values",
]
