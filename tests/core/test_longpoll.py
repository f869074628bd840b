"""A long-poll gives up its thread as soon as nobody waits for its answer: its client disconnected,
or the server cancels the request because it is stopping. Before, the view's thread slept out the
rest of its wait (up to 25 s) and the server process could not exit before it ended (`make run`'s
runserver ignored SIGTERM that long): asgiref waits for a cancelled sync view's thread to finish.

The application here is shaped as Django's ASGI handler is: a sync view run by `sync_to_async`
(thread-sensitive, in a ThreadSensitiveContext per request) beside a task listening for the
client's disconnect, which, when it comes first, cancels the view's task and waits for it."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async

from core import longpoll
from tests.support.waiting import wait_until_async

LONG_WAIT_S = 25.0  # what a long-poll may wait; each test ends long before it
BOUND_S = 10.0  # generous under load, far below LONG_WAIT_S


class Scenario:
    def __init__(self) -> None:
        self.view_started = threading.Event()
        self.pause_answered: bool | None = None
        self.disconnect = asyncio.Event()

    def view(self) -> None:
        self.view_started.set()
        self.pause_answered = longpoll.pause(LONG_WAIT_S)

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        async with ThreadSensitiveContext():
            view = asyncio.ensure_future(sync_to_async(self.view, thread_sensitive=True)())
            listen = asyncio.ensure_future(receive())
            done, _ = await asyncio.wait({view, listen}, return_when=asyncio.FIRST_COMPLETED)
            if listen in done and listen.result()["type"] == "http.disconnect":
                view.cancel()
                try:
                    await view  # asgiref waits for the thread here
                except asyncio.CancelledError:
                    pass
            listen.cancel()

    async def receive(self) -> dict[str, Any]:
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    async def started(self) -> None:
        await wait_until_async(self.view_started.is_set, "the view to start", deadline=BOUND_S, every=0.01)


async def _send(message: Any) -> None:
    pass


def test_a_long_poll_ends_as_soon_as_its_client_disconnects() -> None:
    async def run() -> float:
        scenario = Scenario()
        application = longpoll.abandon_when_done(scenario.app)
        task = asyncio.ensure_future(application({"type": "http"}, scenario.receive, _send))
        await scenario.started()
        began = time.monotonic()
        scenario.disconnect.set()
        await asyncio.wait_for(task, BOUND_S)
        assert scenario.pause_answered is True  # "abandoned": answer what you have
        return time.monotonic() - began

    assert asyncio.run(run()) < BOUND_S


def test_a_long_poll_ends_as_soon_as_the_server_cancels_its_request() -> None:
    """What daphne does to every open request when it is told to stop."""

    async def run() -> None:
        scenario = Scenario()
        application = longpoll.abandon_when_done(scenario.app)
        task = asyncio.ensure_future(application({"type": "http"}, scenario.receive, _send))
        await scenario.started()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, BOUND_S)  # a TimeoutError instead would fail the test
        assert scenario.pause_answered is True

    asyncio.run(run())


def test_an_answered_request_releases_nothing_early_and_pause_sleeps_outside_requests() -> None:
    seen: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(longpoll.abandoned())
        seen.append(await sync_to_async(longpoll.pause)(0.01))

    asyncio.run(longpoll.abandon_when_done(app)({"type": "http"}, None, _send))
    assert seen == [False, False]  # in the request, before its end: not abandoned, slept it out
    assert longpoll.abandoned() is False and longpoll.pause(0.01) is False  # no request at all
