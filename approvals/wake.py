"""Waking the long-polls waiting on an approval request, without each of them polling.

After a decision commits, `notify` bumps the request's wake counter in the cache (what a waiter
compares against) and, with Redis, publishes the counter's key on one channel. Each process runs
at most one subscriber thread (started by its first waiter) that turns those messages into a
`threading.Condition` broadcast, so a hundred waiting requests cost one Redis connection and no
polling. Without Redis (embedded mode), or while the subscriber is not connected, waiters poll the
cache counter instead; either way they re-read the database every second.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache

from core.longpoll import pause

log = logging.getLogger(__name__)

CHANNEL = "sagaplane:approvals:wake"
POLL_S = 0.05


def wake_key(tenant_id: int, request_id: str) -> str:
    return f"approvals:wake:{tenant_id}:{request_id}"


def notify(tenant_id: int, request_id: str) -> None:
    """Best effort, after the commit: waiters also re-read the database every second."""
    key = wake_key(tenant_id, request_id)
    if not cache.add(key, 1, timeout=3600):
        cache.incr(key)
    if settings.REDIS_URL:
        _client().publish(CHANNEL, key)


_lock = threading.Lock()
_changed = threading.Condition(_lock)
_heard: dict[str, int] = {}
_listening = False
_thread: threading.Thread | None = None
_redis: Any = None


def _client() -> Any:
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2)
    return _redis


def _listen() -> None:
    global _listening
    import redis

    while True:
        try:
            pubsub = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2).pubsub(
                ignore_subscribe_messages=True
            )
            pubsub.subscribe(CHANNEL)
            with _lock:
                _listening = True
            for message in pubsub.listen():
                key = message.get("data")
                if isinstance(key, bytes):
                    key = key.decode()
                with _changed:
                    _heard[key] = _heard.get(key, 0) + 1
                    if len(_heard) > 100_000:
                        _heard.clear()
                    _changed.notify_all()
        except Exception:
            log.warning("approvals wake-up subscriber lost Redis; retrying", exc_info=True)
        with _lock:
            _listening = False
        time.sleep(1.0)


def _ensure_listener() -> bool:
    global _thread
    if not settings.REDIS_URL:
        return False
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_listen, name="approvals-wake", daemon=True)
            _thread.start()
        return _listening


def heard(key: str) -> int:
    with _lock:
        return _heard.get(key, 0)


def wait(key: str, seen: Any, heard_before: int, until: float) -> None:
    """Until the key's counter moves from `seen` (read before the state; `heard_before`: the
    subscriber's count then), or `until` (time.monotonic())."""
    if _ensure_listener():
        with _changed:
            _changed.wait_for(
                lambda: _heard.get(key, 0) != heard_before, timeout=max(0.0, until - time.monotonic())
            )
        return
    while time.monotonic() < until:
        if pause(POLL_S) or cache.get(key) != seen:
            return
