"""Debian's Chromium, as every browser test drives it (never a downloaded browser)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")  # as infra/prerequisites.sh installs it
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def launched() -> Iterator[Any]:
    """A headless Chromium for the block. Playwright's sync API runs an event loop on this thread
    while it is open: keep the block short of any test that calls asyncio.run()."""
    from playwright.sync_api import sync_playwright

    from tests.support.prerequisites import unavailable

    if not Path(CHROMIUM).exists():
        unavailable(f"{CHROMIUM} is not installed (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
