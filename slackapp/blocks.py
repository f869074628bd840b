"""The channel message of one approval request, in Block Kit.

Pending: the action's facts (tool, amount, arguments, saga, policy, votes needed, deadline) and
Approve / Deny buttons, or, where the policy demands a passkey, only a link to the request's page
("Approve with passkey"): a Slack identity is no second factor. Decided: the same facts, who
decided, and no buttons.

Everything an agent wrote (tool names, arguments, notes) is escaped: Slack reads `<...>` as links
and mentions (`<!channel>`), and an agent must not be able to page a whole workspace.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.urls import NoReverseMatch, reverse

from core.numbers import amount_text

APPROVE = "approve"
DENY = "deny"
OPEN_PASSKEY = "open_passkey"
ARGS_SHOWN = 2500  # a section's text holds 3000 characters


def obj(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one (payloads are read defensively)."""
    return value if isinstance(value, dict) else {}


def esc(value: Any) -> str:
    """Slack's mrkdwn escaping: &, < and > (the characters of links and mentions)."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def request_page(request_id: str) -> str:
    """The request's page on the dashboard (its path; `services.public_url` makes it absolute)."""
    try:
        return reverse("approval-detail", args=[request_id])
    except NoReverseMatch:  # a request id no page route takes: the queue
        return "/approvals/"


def _deadline(value: Any) -> str:
    if not value:
        return "none"
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return esc(value)
    # Slack shows the date in each reader's time zone; the text after | is the fallback.
    return f"<!date^{int(moment.timestamp())}^{{date_short_pretty}} {{time}}|{esc(moment.isoformat())}>"


def _amount(request: dict[str, Any]) -> str:
    args = obj(request.get("args"))
    return esc(amount_text(request.get("amount", args.get("amount")), args.get("currency")))


def passkey_only(request: dict[str, Any]) -> bool:
    rules = obj(request.get("rules"))
    return bool(request.get("passkey_only", rules.get("passkey_only", False)))


def facts(request: dict[str, Any]) -> list[dict[str, Any]]:
    policy = request.get("policy_name") or request.get("policy") or "—"
    if isinstance(policy, dict):
        policy = policy.get("name", "—")
    required = request.get("required", 1)
    approvals = request.get("approvals", 0)
    args = request.get("args", {})
    shown = json.dumps(args, sort_keys=True, indent=1, ensure_ascii=False, default=str)
    if len(shown) > ARGS_SHOWN:
        shown = shown[:ARGS_SHOWN] + "\n… (cut; the request page shows all of it)"
    return [
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": f"*Tool*\n`{esc(request.get('tool', '?'))}`"},
                {"type": "mrkdwn", "text": f"*Amount*\n{_amount(request)}"},
                {"type": "mrkdwn", "text": f"*Saga*\n`{esc(request.get('saga_id', '?'))}`"},
                {"type": "mrkdwn", "text": f"*Policy*\n{esc(policy)}"},
                {"type": "mrkdwn", "text": f"*Votes*\n{esc(approvals)} of {esc(required)} needed"},
                {"type": "mrkdwn", "text": f"*Deadline*\n{_deadline(request.get('expires_at'))}"},
            ],
        },
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*Arguments*\n```{esc(shown)}```"}},
    ]


def pending(request: dict[str, Any], page_url: str, mentions: list[str] | None = None) -> tuple[str, list]:
    """(fallback text, blocks) of a request still waiting for votes."""
    request_id = str(request.get("id", ""))
    text = f"Approval needed: {esc(request.get('tool', '?'))} (saga {esc(request.get('saga_id', '?'))})"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": "Approval needed"[:150]}},
        *facts(request),
    ]
    if passkey_only(request):
        blocks.append(
            {
                "type": "actions",
                "block_id": f"req:{request_id}"[:255],
                "elements": [
                    {
                        "type": "button",
                        "action_id": OPEN_PASSKEY,
                        "text": {"type": "plain_text", "text": "Approve with passkey"},
                        "url": page_url,
                        "value": request_id,
                    }
                ],
            }
        )
        note = "This policy needs a passkey: decide on the request page."
    else:
        blocks.append(
            {
                "type": "actions",
                "block_id": f"req:{request_id}"[:255],
                "elements": [
                    {
                        "type": "button",
                        "action_id": APPROVE,
                        "style": "primary",
                        "text": {"type": "plain_text", "text": "Approve"},
                        "value": request_id,
                    },
                    {
                        "type": "button",
                        "action_id": DENY,
                        "style": "danger",
                        "text": {"type": "plain_text", "text": "Deny"},
                        "value": request_id,
                    },
                ],
            }
        )
        note = f"<{page_url}|Open the request> for the whole action."
    context = f"Request `{esc(request_id)}` · {note}"
    if mentions:
        context = " ".join(mentions) + " · " + context
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    return text, blocks


OUTCOME = {
    "approved": ":white_check_mark: Approved",
    "consumed": ":white_check_mark: Approved (its effect started)",
    "lapsed": ":hourglass: Approved, but not started in its window",
    "denied": ":no_entry: Denied",
    "expired": ":hourglass: Expired without a decision (denied)",
}


def decided(request: dict[str, Any], page_url: str, deciders: list[str]) -> tuple[str, list]:
    """(fallback text, blocks) of a decided request: who decided (`deciders`: mrkdwn, escaped by
    the caller, who may mention linked Slack users), no buttons."""
    status = str(request.get("status", ""))
    outcome = OUTCOME.get(status, esc(status))
    who = ", ".join(deciders) if deciders else None
    line = f"{outcome}" + (f" by {who}" if who and status != "expired" else "")
    if request.get("break_glass"):
        line += " (break-glass)"
    note = request.get("note")
    if isinstance(note, str) and note:
        line += f"\n> {esc(note[:500])}"
    text = f"{OUTCOME.get(status, status)}: {esc(request.get('tool', '?'))}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": "Approval request"}},
        *facts(request),
        {"type": "section", "text": {"type": "mrkdwn", "text": line}},
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": f"Request `{esc(request.get('id', ''))}` · <{page_url}|Open the request>",
                }
            ],
        },
    ]
    return text, blocks
