"""Headless Chromium (Debian's `chromium`, never a downloaded browser) driven by Playwright."""

import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import BrowserContext, async_playwright

CHROMIUM = Path(os.environ.get("CONTEXTD_TEST_CHROMIUM", "/usr/bin/chromium"))
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "inspector"


@pytest.fixture
async def browser() -> AsyncIterator[BrowserContext]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"the inspector's browser tests need Chromium and {CHROMIUM} is not there: run "
            "`make test` (it installs Debian's chromium with apt-get as root), or `sudo apt-get "
            "install chromium`, or set CONTEXTD_TEST_CHROMIUM=/path/to/chromium",
            pytrace=False,
        )
    with tempfile.TemporaryDirectory(prefix="contextd-chromium-") as profile:
        async with async_playwright() as playwright:
            context = await playwright.chromium.launch_persistent_context(
                profile,
                executable_path=str(CHROMIUM),
                headless=True,
                args=FLAGS,
                viewport={"width": 1280, "height": 900},
            )
            try:
                yield context
            finally:
                await context.close()
