import pytest
from django.test import Client


@pytest.mark.smoke
def test_healthz_answers(db: None) -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200 and response.json()["status"] == "ok"


@pytest.mark.smoke
def test_readyz_ok_when_everything_is_reachable(db: None, settings) -> None:
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    checks = response.json()["checks"]
    assert checks["database"] == "ok" and checks["broker"] == "ok"
    if settings.REDIS_URL:
        assert checks["redis"] == "ok"


def test_readyz_names_redis_when_it_is_down(db: None, settings) -> None:
    # A port nothing listens on: Redis is configured but unreachable.
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert "redis" in body["failing"]
    assert body["checks"]["redis"] == "error"
    assert body["checks"]["database"] == "ok"
    # Component names only: the driver's message (host, port, errno) stays in the server's log.
    assert "127.0.0.1" not in response.content.decode() and "Error" not in response.content.decode()
