"""Readiness probes for wait_until: does a server started by a test or benchmark answer yet?"""

from __future__ import annotations


def healthy(url: str, headers: dict[str, str] | None = None) -> bool:
    """`url`/healthz answers 200 (headers: X-Forwarded-Proto for a server behind a TLS proxy)."""
    import httpx

    try:
        return httpx.get(f"{url}/healthz", headers=headers, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def redis_answers(url: str) -> bool:
    """The Redis at `url` answers PING."""
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False
