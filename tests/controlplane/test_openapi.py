"""The OpenAPI schema documents the API, and the docs page loads nothing from a CDN."""

import re

import pytest
from django.test import Client


@pytest.mark.smoke
def test_schema_lists_the_tenant_api(db: None) -> None:
    response = Client().get("/api/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    for route in ("/api/v1/tenant", "/api/v1/keys", "/api/v1/members"):
        assert route in schema["paths"], route


@pytest.mark.smoke
def test_docs_page_assets_are_served_locally(db: None) -> None:
    page = Client().get("/api/docs")
    assert page.status_code == 200
    html = page.content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources, "the docs page should load its scripts and styles"
    external = [s for s in sources if re.match(r"^(https?:)?//", s)]
    assert external == [], f"docs page loads assets from elsewhere: {external}"
    for asset in [s for s in sources if s.startswith("/static/")]:
        assert Client().get(asset).status_code == 200, asset
