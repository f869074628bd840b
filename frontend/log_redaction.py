"""Invitation links never reach the log: the token in `/invite/<token>` is a bearer credential
(whoever holds it joins the tenant), and Django writes the request path of every 4xx and 5xx
(`Gone: /invite/...`, `Internal Server Error: /invite/...`). The console handler's filter rewrites
the token into a keyed reference, so two log lines about one link can still be matched.

No model imports here: logging is configured before the app registry is ready."""

from __future__ import annotations

import logging
import re

INVITE_PATH = re.compile(r"(/invite/)([^/\s?#\"'<>]+)")


def token_reference(token: str) -> str:
    from django.utils.crypto import salted_hmac

    return "ref:" + salted_hmac("sagaplane.invitation-reference", token).hexdigest()[:16]


def redact(text: str) -> str:
    return INVITE_PATH.sub(lambda m: m.group(1) + token_reference(m.group(2)), text)


class RedactInvitationTokens(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "/invite/" in message:
            record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and "/invite/" in record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True
