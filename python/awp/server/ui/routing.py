"""What every route of the dashboard goes through (:func:`ui_route`: the session, the error page, the security
headers) and the small helpers of their answers and queries."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import psycopg
import psycopg_pool
from aiohttp import web

from awp.protocol.jsonio import dumps
from awp.server.appstate import CONFIG, DB
from awp.server.errors import ApiError
from awp.server.middleware import database_error
from awp.server.ui.render import render
from awp.server.ui.session import COOKIE, SESSION_TTL_S, Session, read_session, renew_session, set_session_cookie

# Scripts and styles from the gateway only, no inline script. 'unsafe-eval' is allowed because browser automation
# (Playwright's wait_for_function, used by tests and by people scripting the dashboard) evaluates strings in the
# page; the dashboard's own script never does, and with no inline or foreign script nothing else could.
CSP = (
    "default-src 'none'; script-src 'self' 'unsafe-eval'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def _secure_headers(response: web.StreamResponse) -> None:
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Cache-Control", "no-store")


def redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


UiHandler = Callable[[web.Request, Session | None], Awaitable[web.StreamResponse]]
Route = tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]


def ui_route(routes: list[Route], method: str, path: str, kind: str = "page") -> Callable[[UiHandler], UiHandler]:
    """Add the route ``method path`` to ``routes`` (a module's list, added to the application by
    :func:`awp.server.ui.setup_ui`), its handler guarded as ``kind`` says.

    ``kind``: ``page`` (HTML; signed out: redirect to the sign-in form), ``part`` (HTML or JSON fetched by
    the page's script; signed out: 401), ``public`` (no session needed, the handler sees it when there is one)
    or ``open`` (the session is not read: static files, the sign-in itself). A session is read from the cookie,
    then asked about in the database (signed out?); the answer of a request with a session renews its cookie
    when due (:func:`renew_session`), unless the handler set or deleted the cookie itself."""

    def register(handler: UiHandler) -> UiHandler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            now = time.time()
            config = request.app[CONFIG]
            cookie = None if kind == "open" else read_session(config, request.cookies.get(COOKIE), now)
            session: Session | None = None
            try:
                if cookie is not None and not await request.app[DB].ui_session_revoked(cookie.session_id):
                    session = cookie
                if session is None and kind in ("page", "part"):
                    if kind == "page" and method == "GET":
                        response: web.StreamResponse = redirect("/ui/?" + urlencode({"next": request.path_qs}))
                    else:
                        raise ApiError.of(401, "sign in first: the session is missing, has expired or was signed out")
                else:
                    response = await handler(request, session)
            except (ApiError, psycopg.Error, psycopg_pool.PoolTimeout) as e:
                if kind == "part":
                    raise  # the gateway's middleware answers JSON
                error = e if isinstance(e, ApiError) else database_error(request, e)
                response = render(request, "error.html", status=error.status, session=session, error=error, nav="")
            if session is not None and COOKIE not in response.cookies:
                renewed = renew_session(config, session, now)
                if renewed is not None:
                    set_session_cookie(request, response, renewed, min(SESSION_TTL_S, session.ends - int(now)))
            _secure_headers(response)
            return response

        guarded.__name__ = "ui_" + handler.__name__
        routes.append((method, path, guarded))
        return handler

    return register


def page_number(value: str | None) -> int:
    """A 1-based page number from the query (anything else: the first page), 0-based."""
    if value and value.isascii() and value.isdigit() and 0 < int(value) < 10**6:
        return int(value) - 1
    return 0


def query_param(request: web.Request, name: str, max_len: int = 256) -> str | None:
    value = request.query.get(name, "").strip()
    if not value:
        return None
    if len(value) > max_len or "\x00" in value:
        raise ApiError.of(400, f"invalid {name}")
    return value


def fragment_response(request: web.Request, response: web.Response) -> web.Response:
    """A fragment with an ETag; 304 when the page already has it."""
    body = response.body
    assert isinstance(body, bytes | bytearray), "a rendered fragment (text), not a payload"
    etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers={"ETag": etag})
    response.headers["ETag"] = etag
    return response


def json_answer(value: Any) -> web.Response:
    return web.Response(text=dumps(value), content_type="application/json", headers={"Cache-Control": "no-store"})
