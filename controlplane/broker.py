"""The embedded Celery broker (no REDIS_URL): kombu's filesystem transport, with every message made
visible whole.

kombu writes a message into the queue folder in place (create, then write), and a consumer polling
the folder takes any file with the queue's name: one taken between the two is read empty (or cut
short). The worker then dies of a JSONDecodeError and the message is lost with it
(celery/kombu#1551). Here a message is written under a name no consumer takes, synced, then renamed
into place (a rename is atomic), so a consumer sees it whole or not at all; and a file that still
cannot be read (left by a crash of an older writer) is logged and skipped instead of killing the
worker. Selected by settings.CELERY_BROKER_TRANSPORT on the embedded defaults."""

from __future__ import annotations

import logging
import os
import uuid
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

logger = logging.getLogger(__name__)

# A consumer takes a file whose name, after its first dot, is "<queue>.msg": this suffix hides one.
UNFINISHED = ".unfinished"


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]  # as kombu's own
        """Put a message on `queue`: written whole under a hidden name, then renamed into place."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        unfinished = final + UNFINISHED
        try:
            with open(unfinished, "wb") as file:
                file.write(dumps(payload).encode())
                file.flush()
                os.fsync(file.fileno())  # renamed only once on disk: a crash leaves no empty message
            os.replace(unfinished, final)
        except OSError as exc:
            raise ChannelError(f"cannot add a message to {self.data_folder_out!r}") from exc

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        try:
            return super()._get(queue)
        except ValueError as exc:  # an unreadable file, already taken off the queue
            logger.error("embedded broker: skipped an unreadable message on %s: %s", queue, exc)
            raise Empty() from exc


class Transport(filesystem.Transport):
    Channel = Channel
