"""Slack helpers for tests: the owner's browser and its install of the app (the whole OAuth round
trip, through the local server speaking Slack's Web API: tests/slackapp/slack_server.py), and
Slack's side, signed requests (a slash command's body, a button's click). The fixtures (the local
server, the app's settings pointed at it) are in tests/slackapp/conftest.py."""

from __future__ import annotations

import html
import json
import re
import time
import uuid
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
from django.test import Client

from tests.slackapp.slack_server import FakeSlack


def browser(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _link(page: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}" href="([^"]+)"', page)
    assert found, page[:2000]
    return html.unescape(found.group(1))


def consent_url(client: Client) -> str:
    """The href of the settings page's "Add to Slack" link (its state issued for this page)."""
    settings_page = client.get("/integrations/slack/")
    assert settings_page.status_code == 200, settings_page.content[:500]
    return _link(settings_page.content.decode(), "slack-add")


def install(client: Client, slack: FakeSlack, channel: str | None = "C0RISK") -> Any:
    """The owner's browser through the whole OAuth v2 round trip: our "Add to Slack" link, Slack's
    consent page (the local server's), its "Allow", which redirects back as Slack does, our
    callback; then the channel. Returns the callback's response."""
    consent_page = httpx.get(consent_url(client), follow_redirects=False)
    assert consent_page.status_code == 200, consent_page.text
    consent = httpx.get(slack.url + _link(consent_page.text, "allow"), follow_redirects=False)
    assert consent.status_code == 302, consent.text
    back = urlsplit(consent.headers["Location"])
    assert back.netloc == "testserver" and back.path == "/integrations/slack/oauth/callback"
    answer = client.get(f"{back.path}?{back.query}")
    if channel is not None:
        client.post("/integrations/slack/channel", {"channel": channel})
    answer.callback_url = f"{back.path}?{back.query}"  # type: ignore[attr-defined]
    return answer


def signed_post(
    client: Client,
    slack: FakeSlack,
    path: str,
    body: bytes,
    *,
    content_type: str = "application/x-www-form-urlencoded",
    timestamp: int | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    """POST `body` to one of /slack/... as Slack would: signed over exactly these bytes."""
    signature = headers if headers is not None else slack.sign(body, timestamp)
    return client.generic("POST", path, body, content_type=content_type, **signature)  # type: ignore[arg-type]


def click_body(
    slack: FakeSlack, action_id: str, request_id: str, user: str, channel: str = "C0RISK"
) -> bytes:
    payload = {
        "type": "block_actions",
        "team": {"id": slack.team_id, "domain": "acme"},
        "user": {"id": user, "team_id": slack.team_id},
        "channel": {"id": channel},
        "container": {"type": "message", "channel_id": channel, "message_ts": "1.000001"},
        "actions": [
            {"action_id": action_id, "value": request_id, "type": "button", "action_ts": str(time.time())}
        ],
        "response_url": f"{slack.url}/hooks/actions/1",
        "trigger_id": uuid.uuid4().hex,
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def command_body(slack: FakeSlack, command: str, text: str, user: str) -> bytes:
    return urlencode(
        {
            "command": command,
            "text": text,
            "team_id": slack.team_id,
            "user_id": user,
            "channel_id": "C0RISK",
            "response_url": f"{slack.url}/hooks/commands/{user}",
            "trigger_id": uuid.uuid4().hex,  # Slack's bodies differ: each has its own trigger
        }
    ).encode()
