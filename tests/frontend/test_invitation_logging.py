"""An invitation link is a credential: an error on it must not write the token to the log."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from django.test import Client

from frontend import invitations
from frontend.log_redaction import RedactInvitationTokens, token_reference
from tests.support.factories import Person


@pytest.fixture
def console_log() -> Iterator[io.StringIO]:
    """What the configured console handler (settings.LOGGING) writes, captured."""
    handlers = [
        handler
        for handler in logging.getLogger().handlers
        if isinstance(handler, logging.StreamHandler)
        and any(isinstance(f, RedactInvitationTokens) for f in handler.filters)
    ]
    assert handlers, "settings.LOGGING's console handler lost its invitation-token filter"
    buffer = io.StringIO()
    previous = [h.setStream(buffer) for h in handlers]
    try:
        yield buffer
    finally:
        for handler, stream in zip(handlers, previous, strict=True):
            handler.setStream(stream)


@pytest.mark.smoke
def test_an_error_on_an_invitation_logs_a_reference_not_the_token(
    alice: Person, console_log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = invitations.make_token(alice.tenant, "new@acme.example", "viewer", alice.user)

    def broken(value: str) -> None:
        raise RuntimeError(f"could not read invitation /invite/{value}")

    monkeypatch.setattr(invitations, "read_token", broken)
    response = Client(raise_request_exception=False).get(f"/invite/{token}")
    assert response.status_code == 500
    written = console_log.getvalue()
    assert "Internal Server Error: /invite/" in written  # the error was logged...
    assert token not in written  # ...without the token, in the message or the traceback
    assert token_reference(token) in written  # ...but with a reference that names it


@pytest.mark.smoke
def test_a_refused_invitation_logs_a_reference_not_the_token(alice: Person, console_log: io.StringIO) -> None:
    token = invitations.make_token(alice.tenant, "new@acme.example", "viewer", alice.user)
    tampered = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    assert Client().get(f"/invite/{tampered}").status_code == 410
    written = console_log.getvalue()
    assert "Gone: /invite/" in written and tampered not in written
    assert token_reference(tampered) in written
