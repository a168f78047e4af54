"""Helpers of the dashboard tests (python/tests/ui/): Debian's Chromium, a page's watch and sign-in, a forged form.

Chromium is Debian's (``/usr/bin/chromium``, installed by ``make setup`` and ``.ci/run``; ``AWP_CHROMIUM`` to
override), driven by Playwright for Python with ``executable_path``: no browser is downloaded. The fixtures
(``browser``, ``open_ui``, ``sql``) are python/tests/ui/conftest.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

CHROMIUM = os.environ.get("AWP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
# Every page records its longest main-thread task (ms) in window.__longest.
LONGEST_TASK = """window.__longest = 0;
try { new PerformanceObserver(list => {
        for (const e of list.getEntries()) window.__longest = Math.max(window.__longest, e.duration); })
      .observe({type: 'longtask', buffered: true}); } catch (e) {}"""


@dataclass
class Watch:
    """What the browser did: requests, console errors and uncaught exceptions, over every page of a context."""

    origin: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def check(self, gateway_log: str = "") -> None:
        foreign = [url for url in self.requests if not url.startswith(self.origin + "/")]
        assert not foreign, f"requests to another host: {foreign}"
        assert not self.errors, f"console errors: {self.errors}\ngateway log:\n{gateway_log}"


def sign_in(page: Any, token: str) -> None:
    page.goto("/ui/")
    page.fill("input[name=token]", token)
    page.press("input[name=token]", "Enter")
    page.wait_for_load_state()


def ui_post(page: Any, path: str, form: dict[str, str], headers: dict[str, str] | None = None) -> Any:
    """A POST with the page's cookies (the browser context's request client), as a forged form would send it."""
    return page.context.request.post(path, form=form, headers=headers or {}, max_redirects=0)
