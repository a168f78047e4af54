"""Dashboard sessions end (issue 44): sign-out revokes the session in the database, so its cookie, replayed on any
gateway replica, opens no page and cancels nothing; a cookie idle for longer than its lifetime is refused; a
session in use is renewed (a new cookie of the same session) up to its absolute cap.

Two real ``awp serve`` replicas on one database with the same tokens, Debian's Chromium for the sign-in and the
sign-out, plain HTTP clients for the replays (python/awp/server/ui/session.py,
actions.py; db/functions/ui_sessions.sql).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from ui_support import VIEWPORT, sign_in
from worker_support import apply, get_run, start_run

from awp.server.appstate import GatewayConfig
from awp.server.auth import Role
from awp.server.ui.session import (
    COOKIE,
    SESSION_MAX_S,
    SESSION_TTL_S,
    _cookie,
    new_session,
    read_session,
    renew_session,
)
from awp_testing.gateway import ServeProcess, serve


@pytest.fixture(scope="module")
def replicas(db_dsn: str) -> Iterator[tuple[ServeProcess, ServeProcess]]:
    with serve(db_dsn) as a, serve(db_dsn, tokens=a.tokens) as b:
        yield a, b


def signing(gw: ServeProcess) -> GatewayConfig:
    """The gateway's secrets, to make cookies as it does (a session that started or was renewed in the past)."""
    return GatewayConfig("postgresql:///unused", gw.tokens.viewer, gw.tokens.operator, gw.tokens.bootstrap)


def waiting_run(gw: ServeProcess, wid: str) -> str:
    """A run no worker takes (python executor, none here): it stays pending until canceled."""
    return start_run(gw, apply(gw, {"id": wid, "tasks": [{"key": "t0", "executor": "python"}]}))


def client(gw: ServeProcess, cookie: str) -> httpx.Client:
    return httpx.Client(base_url=gw.base_url, cookies={COOKIE: cookie}, timeout=10)


def refused(gw: ServeProcess, cookie: str, run_id: str, csrf: str) -> None:
    """Every kind of dashboard request with ``cookie`` is answered as signed out; the cancel changes nothing."""
    with client(gw, cookie) as http:
        for path in ("/ui/runs", f"/ui/runs/{run_id}", "/ui/workers"):
            r = http.get(path)
            assert r.status_code == 303 and r.headers["location"].startswith("/ui/?next="), (path, r.status_code)
        for path in (f"/ui/runs/{run_id}/changes?revision=0&after=0", f"/ui/runs/{run_id}/tasks/t0"):
            r = http.get(path)
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", (path, r.text)
        form = http.get("/ui/")  # the sign-in form, not a redirect to a page that sends it back here
        assert form.status_code == 200 and 'name="token"' in form.text
        r = http.post(f"/ui/runs/{run_id}/cancel", data={"csrf_token": csrf})
        assert r.status_code == 401 and "sign in first" in r.text
        assert "set-cookie" not in r.headers  # no renewal of a refused session
        assert http.post("/ui/logout", data={"csrf_token": csrf}).status_code == 401
    assert get_run(gw, run_id)["status"] == "pending"


def test_a_cookie_replayed_after_sign_out_is_refused_by_every_replica(
    replicas: tuple[ServeProcess, ServeProcess], browser: Any
) -> None:
    a, b = replicas
    run_id = waiting_run(a, "ui-signout")
    context = browser.new_context(viewport=VIEWPORT, base_url=a.base_url)
    try:
        page = context.new_page()
        sign_in(page, a.tokens.operator)
        assert page.url == a.url("/ui/runs")
        page.goto(f"/ui/runs/{run_id}")
        assert page.get_by_role("button", name="Cancel").is_visible()
        (cookie,) = [c["value"] for c in context.cookies() if c["name"] == COOKIE]
        csrf = page.locator("input[name=csrf_token]").first.get_attribute("value")
        assert csrf
        for gw in (a, b):  # the copied cookie and its CSRF token work on both replicas before the sign-out
            with client(gw, cookie) as http:
                assert http.get(f"/ui/runs/{run_id}").status_code == 200
                other = waiting_run(gw, f"ui-signout-{gw.port}")
                assert (
                    http.post(f"/ui/runs/{other}/cancel", data={"csrf_token": csrf, "confirmed": "yes"}).status_code
                    == 303
                )
                assert get_run(gw, other)["status"] == "canceled"
        page.click("text=Sign out")
        page.wait_for_url(a.url("/ui/"))
        assert context.cookies() == []
        page.goto(f"/ui/runs/{run_id}")
        assert page.locator("input[name=token]").is_visible()
    finally:
        context.close()
    for gw in (a, b):  # signed out on a: refused by a and by b
        refused(gw, cookie, run_id, csrf)


def test_an_idle_session_expires_and_a_session_in_use_is_renewed_up_to_its_cap(
    replicas: tuple[ServeProcess, ServeProcess],
) -> None:
    a, b = replicas
    config = signing(a)
    run_id = waiting_run(a, "ui-idle")
    now = time.time()
    idle = new_session(config, Role.OPERATOR, now - SESSION_TTL_S - 5)  # its last request: 30 min ago
    old = read_session(config, idle, now - SESSION_TTL_S - 5)
    assert old is not None
    refused(a, idle, run_id, old.csrf)

    # In use: a cookie issued 20 minutes ago (10 minutes left) gets a new one of the same session, 30 minutes long.
    aging = new_session(config, Role.OPERATOR, now - 20 * 60)
    with client(b, aging) as http:
        r = http.get("/ui/runs")
        assert r.status_code == 200
        renewed = r.cookies[COOKIE]
        assert "max-age=1800" in r.headers["set-cookie"].lower() and "httponly" in r.headers["set-cookie"].lower()
    before, after = read_session(config, aging), read_session(config, renewed)
    assert before is not None and after is not None
    assert (after.session_id, after.started, after.csrf) == (before.session_id, before.started, before.csrf)
    assert after.expires - before.expires >= 20 * 60 - 5
    with client(a, renewed) as http:  # a fresh cookie is not renewed again at once
        r = http.get("/ui/workers")
        assert r.status_code == 200 and "set-cookie" not in r.headers

    # Signing out with the renewed cookie signs out the older cookie of the same session too.
    with client(a, renewed) as http:
        assert http.post("/ui/logout", data={"csrf_token": after.csrf}).status_code == 303
    refused(b, aging, run_id, before.csrf)

    # Near the cap (12 hours after the sign-in), renewal stops at the cap; past it the session is over.
    started = int(now) - SESSION_MAX_S + 120
    late = new_session(config, Role.VIEWER, started)
    late_session = read_session(config, late, started)
    assert late_session is not None
    capped = renew_session(config, late_session, now)
    assert capped is not None
    with client(a, capped) as http:
        r = http.get("/ui/runs")
        assert r.status_code == 200 and "set-cookie" not in r.headers  # nothing left to extend
    capped_session = read_session(config, capped, now)
    assert capped_session is not None and capped_session.expires == started + SESSION_MAX_S
    assert read_session(config, capped, started + SESSION_MAX_S) is None
    # A cookie signed with a later expiry (a gateway whose cap was longer) still ends at the cap.
    beyond = _cookie(config, Role.VIEWER, late_session.session_id, started - 600, int(now) + 600)
    with client(a, beyond) as http:
        assert http.get("/ui/runs").status_code == 303


def test_the_revocation_functions_record_check_prune_and_refuse_bad_input(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as c:

        def revoked(session_id: str) -> bool:
            return bool(c.execute("SELECT awp.ui_session_revoked(%s)", (session_id,)).fetchone()[0])  # type: ignore[index]

        c.execute("SELECT awp.revoke_ui_session('sql-a', now() + interval '11 hours')")
        c.execute("SELECT awp.revoke_ui_session('sql-a', now() + interval '11 hours')")  # again: a no-op
        assert revoked("sql-a") and not revoked("sql-b")
        c.execute("SELECT awp.revoke_ui_session('sql-gone', now() - interval '2 hours')")  # expired long ago
        assert not revoked("sql-gone")
        # A record whose session ended more than an hour ago is deleted by the next sign-out.
        c.execute("INSERT INTO awp.ui_revoked_sessions VALUES ('sql-old', now() - interval '61 minutes')")
        c.execute("INSERT INTO awp.ui_revoked_sessions VALUES ('sql-recent', now() - interval '59 minutes')")
        c.execute("SELECT awp.revoke_ui_session('sql-c', now() + interval '1 hour')")
        assert not revoked("sql-old") and revoked("sql-recent") and revoked("sql-c")
        for args in (
            (None, "now()"),
            ("", "now()"),
            ("x" * 65, "now()"),
            ("sql-d", "NULL"),
            ("sql-d", "now() + interval '25 hours'"),
        ):
            with pytest.raises(psycopg.Error) as e:
                c.execute(f"SELECT awp.revoke_ui_session(%s, {args[1]})", (args[0],))
            assert e.value.sqlstate == "AWREQ", args
        shape = c.execute(
            "SELECT p.proname, p.prosecdef, p.proconfig FROM pg_proc p"
            " WHERE p.oid IN ('awp.revoke_ui_session(text, timestamptz)'::regprocedure,"
            "                 'awp.ui_session_revoked(text)'::regprocedure) ORDER BY 1"
        ).fetchall()
        assert [(name, secdef) for name, secdef, _ in shape] == [
            ("revoke_ui_session", True),
            ("ui_session_revoked", True),
        ]
        assert all("search_path=pg_catalog, pg_temp" in config for _, _, config in shape)
        assert c.execute(
            "SELECT has_function_privilege('awp_gateway', 'awp.ui_session_revoked(text)', 'EXECUTE'),"
            " has_table_privilege('awp_gateway', 'awp.ui_revoked_sessions', 'SELECT')"
        ).fetchone() == (True, False)
