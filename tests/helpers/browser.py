"""The dashboard's browser tests: Debian's headless Chromium for Playwright, and waiting on a page."""

from __future__ import annotations

import shutil
import time

from helpers.processes import need_binary


def browser_path() -> str:
    """Debian's headless Chromium for Playwright's executable_path (chromium-headless-shell, else chromium);
    neither installed: need_binary's skip, or failure under CI=true."""
    for name in ("chromium-headless-shell", "chromium"):
        path = shutil.which(name)
        if path:
            return path
    return need_binary("chromium-headless-shell", "chromium-headless-shell")


def page_ready(page, url: str, selector: str | None = None) -> bool:
    """Whether `url` loads in a Playwright page (and shows `selector`): for waiting on a server starting."""
    try:
        resp = page.goto(url)
    except Exception:  # noqa: BLE001 - not up yet
        time.sleep(0.2)
        return False
    if selector is None:
        return resp is not None and resp.ok
    return page.locator(selector).count() > 0


def fits_width(page) -> bool:
    """No sideways scroll of the page itself: the document is no wider than the viewport (a table may
    scroll inside its own box)."""
    return page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
