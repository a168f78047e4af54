"""Fixtures of the dashboard tests (the database, ``gw``, ``workers`` and ``no_live_runs`` are
python/tests/conftest.py's, the helpers python/tests/ui_support.py's).

- ``browser`` (module): Debian's headless Chromium, through Playwright (a dependency of the dev extra: without it
  the tests fail, never skip).
- ``open_ui`` (function): ``open_ui(role="operator", script=True)``, a new 1280x800 browser context signed in with
  that role's token (``None``: signed out), with the page's script or without it, and its page. Every page is
  watched (:class:`ui_support.Watch`): a request to any other origin than the gateway's, a console error or an
  uncaught exception fails the test when it ends.
- ``sql`` (module): an autocommit connection with dict rows to the module's database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.sync_api import sync_playwright
from psycopg.rows import dict_row
from ui_support import CHROMIUM, CHROMIUM_ARGS, LONGEST_TASK, VIEWPORT, Watch, sign_in

from awp_testing.gateway import ServeProcess


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def open_ui(gw: ServeProcess, browser: Any) -> Iterator[Callable[..., Any]]:
    opened: list[tuple[Any, Watch]] = []

    def open_(role: str | None = "operator", script: bool = True) -> Any:
        context = browser.new_context(viewport=VIEWPORT, base_url=gw.base_url, java_script_enabled=script)
        watch = Watch(gw.base_url)
        context.on("request", lambda r: watch.requests.append(r.url))
        context.add_init_script(LONGEST_TASK)
        page = context.new_page()

        def console_error(m: Any) -> None:
            if m.type == "error":
                watch.errors.append(f"{page.url}: {m.text}")

        page.on("console", console_error)
        page.on("pageerror", lambda e: watch.errors.append(f"{page.url}: uncaught {e}"))
        page.set_default_timeout(15_000)
        opened.append((context, watch))
        if role is not None:
            sign_in(page, getattr(gw.tokens, role))
            assert page.url == gw.url("/ui/runs"), page.url
        return page

    yield open_
    for context, _ in opened:
        context.close()
    for _, watch in opened:
        watch.check(gw.log_tail(60) if watch.errors else "")


@pytest.fixture(scope="module")
def sql(db_dsn: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as c:
        yield c
