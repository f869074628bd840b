"""The Slack context's public face for its views, tasks and the dashboard: every state change
(install by OAuth v2, channel, e-mail matching, uninstall, account links, the channel messages)
and the verification of Slack's requests. The code lives in `slackapp.actions`, one module per
aggregate; reads are `slackapp.selectors`.

Each change takes a keyword-only `actor` and appends its record (old and new values, never a
token) to the tenant's server stream in the same transaction. Slack's Web API is reached only
through `web_client`, whose base URL is `SLACK_API_URL`: the same code talks to Slack and to the
tests' local server.
"""

from __future__ import annotations

from slackapp.actions.installations import (
    forget_team,
    list_channels,
    revoke_app,
    set_channel,
    set_email_matching,
    uninstall,
)
from slackapp.actions.links import (
    EmailToMatch,
    ask_slack_name,
    link_token,
    link_url,
    link_user,
    match_by_email,
    member_for,
    read_link_token,
    slack_user_of,
    unlink_user,
)
from slackapp.actions.messages import (
    claim_message_post,
    finish_message,
    is_posted,
    message_posted,
    release_message_claim,
)
from slackapp.actions.oauth import (
    BOT_SCOPES,
    StateStore,
    claim_install,
    exchange_code,
    save_install,
    start_install,
)
from slackapp.actions.signatures import prune_seen_signatures, verify_request
from slackapp.actions.web import (
    API_TIMEOUT_S,
    UNREACHABLE,
    SlackError,
    bot_token,
    configured,
    public_url,
    web_client,
)

__all__ = [
    "API_TIMEOUT_S",
    "BOT_SCOPES",
    "EmailToMatch",
    "UNREACHABLE",
    "SlackError",
    "StateStore",
    "bot_token",
    "ask_slack_name",
    "claim_message_post",
    "configured",
    "claim_install",
    "exchange_code",
    "finish_message",
    "forget_team",
    "is_posted",
    "link_token",
    "link_url",
    "link_user",
    "list_channels",
    "match_by_email",
    "member_for",
    "message_posted",
    "prune_seen_signatures",
    "public_url",
    "read_link_token",
    "release_message_claim",
    "revoke_app",
    "save_install",
    "set_channel",
    "set_email_matching",
    "slack_user_of",
    "start_install",
    "uninstall",
    "unlink_user",
    "verify_request",
    "web_client",
]
