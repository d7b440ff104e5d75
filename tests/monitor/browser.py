"""Headless Chromium for the dashboard tests: the distribution's build, driven by Playwright.

``make browser`` installs it; ``FLUX_CHROMIUM`` names another executable. A missing
browser fails the tests (it never skips them): CI must really run them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

from playwright.sync_api import Browser, sync_playwright

# as the distribution's headless Chromium needs it here: no sandbox as root, and no
# background traffic (component updates, sync) to a network the tests never use
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    """The Chromium executable to drive; AssertionError naming the fix when there is none."""
    explicit = os.environ.get("FLUX_CHROMIUM")
    if explicit:
        return explicit
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError("no Chromium for the browser tests: run `make browser`"
                         " (or set FLUX_CHROMIUM to a Chromium executable)")


@contextlib.contextmanager
def headless_chromium() -> Iterator[Browser]:
    """A headless Chromium (Playwright gives it a fresh, empty profile), closed on exit."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True, args=ARGS,
                                    timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()
