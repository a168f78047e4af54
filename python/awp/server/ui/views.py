"""Routes of the dashboard, its session cookie and its CSRF token.

Sign-in: ``POST /ui/login`` with the viewer or the operator token (never a worker token) sets a session cookie
``awp_ui`` = ``role.started.expires.session_id.signature``: an HMAC-SHA256 under a key derived from that role's
token, so every gateway replica accepts it without asking anyone, and changing a token signs its sessions out.
The cookie is HttpOnly, SameSite=Strict, Secure when the request came over TLS (directly or
``X-Forwarded-Proto: https``), and limited to ``/ui``. Every form that changes something (cancel, re-run, a
signal, sign-out) carries a CSRF token derived from the session (HMAC of its id); a POST without it, or from another
origin (``Origin``, ``Sec-Fetch-Site``), is 403, and a viewer's cancel, re-run or signal is 403 whatever it carries.

Lifetime (docs/operations.md, "Dashboard sessions"): a cookie lasts :data:`SESSION_TTL_S` (30 minutes); a
request with a cookie older than :data:`SESSION_RENEW_S` gets a new one of the same session (same id, same CSRF
token) that lasts 30 minutes from then, up to :data:`SESSION_MAX_S` (12 hours) after the sign-in. Sign-out
records the session's id in the database (``awp.revoke_ui_session``), and every route that reads the session
asks the database first (``awp.ui_session_revoked``, one primary-key lookup), so a signed-out cookie is refused
by every replica, as a missing one is.

Live updates: the run page polls ``/ui/runs/{id}/changes?revision=R&after=S`` about twice a second; the answer
is tiny while the run's ``revision`` is unchanged (read by ``awp.run_revision``, one row: ``awp.get_run`` counts
every task, 125-150 ms at 10,000 tasks on a slow phase of this project's machine) and otherwise carries the new
events (sequence > S, from ``awp.run_events``), which the page applies to the DAG in place, and the re-rendered
summary (a big live run's read shared by every tab for a moment: python/awp/server/ui/recent.py). The runs and workers
pages re-fetch their table (``?fragment=1``, with an ETag) every two seconds.

Dynamic workflows (docs/dynamic.md): the instances of a mapped (``for_each``) task are not nodes of the graph (up
to 10,000 of them: python/awp/server/ui/dag.py); its node shows "succeeded/instances", and its task panel lists them
:data:`INSTANCES_PAGE` at a time (``?task=each&ipage=N``: one ``awp.run_tasks`` page after the instance before the
first shown, as instances are contiguous in definition order). The page's state carries each mapped task's instance
statuses (one character each), so the count follows the events live without asking the database again. A task that
started a child run links to it from its panel (graph nodes are links already, and a link cannot hold another); a
child run's page names its parent run and task.

Signals (docs/waits.md): the panel of a task waiting for a signal shows an operator Approve and Reject (the payloads
:data:`SIGNALS`), each confirmed by a second step before anything is sent (:func:`signal_task`).

Re-run (docs/protocol.md, "Re-run"): the summary of a failed or canceled run shows an operator Re-run, confirmed by a
second step as a signal is, then ``awp.retry_run`` of the whole run (:func:`retry_run`).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import functools
import hashlib
import hmac
import json
import logging
import math
import mimetypes
import secrets
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import jinja2
import psycopg
import psycopg_pool
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from markupsafe import Markup
from multidict import MultiDictProxy

from awp.protocol.jsonio import dumps
from awp.protocol.statuses import LIVE_RUN, RUN_STATUSES, TASK_STATUSES, WAITING_TASK
from awp.server.appstate import CONFIG, DB, GatewayConfig
from awp.server.auth import Role, role_of
from awp.server.errors import ApiError
from awp.server.middleware import database_error
from awp.server.ui import dag
from awp.server.ui.recent import RecentRuns

log = logging.getLogger(__name__)

COOKIE = "awp_ui"
SESSION_TTL_S = 30 * 60  # a cookie's lifetime: the session ends after this long without a request...
SESSION_RENEW_S = 60  # ...as a request renews it once its cookie is this much older...
SESSION_MAX_S = 12 * 3600  # ...up to this long after the sign-in, however it is used
RUNS_PAGE = 25
TIMELINE = 100  # events shown on the run page
CHANGES_LIMIT = 1000  # events per /changes answer
PREVIEW_CHARS = 2000
INSTANCES_PAGE = 50  # instances of a mapped task listed per page of its task panel

WAITS_LIMIT = 500  # /changes carries each waiting task's reason while at most this many wait
GLYPH = {
    "waiting_dependencies": "…",
    "ready": "○",
    "queued": "◔",
    "running": "▶",
    "waiting_retry": "↻",
    "succeeded": "✓",
    "failed": "✗",
    "canceled": "⊘",
    "skipped": "\u2013",  # en dash
}
WORKER_ORDER = {"active": 0, "draining": 1, "offline": 2, "stopped": 3}
# Why a task was skipped (awp.run_tasks skip_reason), as shown after its status; python/awp/server/ui/static/app.js has
# the same words for a task skipped while the page is open.
SKIP_REASONS = {"condition_false": "condition false", "dependency_failed": "dependency failed"}
# The task panel's signal buttons (docs/waits.md: "the dashboard's Reject button sends {"approved": false}"): the
# name a form posts -> the payload awp.send_signal receives, and the words of the panel's notice afterwards.
SIGNALS: dict[str, dict[str, bool]] = {"approve": {"approved": True}, "reject": {"approved": False}}
SIGNAL_DONE = {"approve": "Approved", "reject": "Rejected"}
SIGNAL_NOT_DONE = {"approve": "Not approved", "reject": "Not rejected"}
# The statuses of a run awp.retry_run takes back to running (docs/protocol.md, "Re-run"): its summary's Re-run button.
RERUN_STATUSES = ("failed", "canceled")

# Scripts and styles from the gateway only, no inline script. 'unsafe-eval' is allowed because browser automation
# (Playwright's wait_for_function, used by tests and by people scripting the dashboard) evaluates strings in the
# page; the dashboard's own script never does, and with no inline or foreign script nothing else could.
CSP = (
    "default-src 'none'; script-src 'self' 'unsafe-eval'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

TEMPLATES = web.AppKey("ui_templates", jinja2.Environment)
STATIC = web.AppKey("ui_static", dict)
RECENT = web.AppKey("ui_recent_runs", RecentRuns)
# The thread that lays out and renders run pages, off the event loop (claims, heartbeats and health keep being
# answered meanwhile). One: rendering is pure Python, so more threads would not render faster (the GIL), and
# each would take the GIL from the event loop as often; a page's size is bounded anyway (dag.PAGE_SIZE tasks,
# dag.MAX_EDGES edges).
RENDERER = web.AppKey("ui_renderer", ThreadPoolExecutor)


# -- session and CSRF ----------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _role_key(config: GatewayConfig, role: Role) -> bytes:
    token = config.operator_token if role is Role.OPERATOR else config.viewer_token
    return hmac.new(token.encode(), b"awp-ui-session-v2", hashlib.sha256).digest()


@dataclass(frozen=True)
class Session:
    role: Role
    session_id: str  # random, the same in every cookie of the session (renewals): what sign-out revokes
    started: int  # Unix seconds of the sign-in
    expires: int  # Unix seconds: this cookie's end (at most started + SESSION_MAX_S)
    csrf: str

    @property
    def operator(self) -> bool:
        return self.role is Role.OPERATOR

    @property
    def ends(self) -> int:
        """When the session ends, however it is renewed (Unix seconds)."""
        return self.started + SESSION_MAX_S


def _csrf(key: bytes, session_id: str) -> str:
    return _b64(hmac.new(key, b"csrf." + session_id.encode(), hashlib.sha256).digest())


def _signature(key: bytes, payload: str) -> str:
    return _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())


def _cookie(config: GatewayConfig, role: Role, session_id: str, started: int, expires: int) -> str:
    payload = f"{role.value}.{started}.{expires}.{session_id}"
    return f"{payload}.{_signature(_role_key(config, role), payload)}"


def new_session(config: GatewayConfig, role: Role, now: float | None = None) -> str:
    """The cookie value of a new session for ``role`` (viewer or operator)."""
    started = int(time.time() if now is None else now)
    return _cookie(config, role, secrets.token_urlsafe(18), started, started + SESSION_TTL_S)


def renew_session(config: GatewayConfig, session: Session, now: float | None = None) -> str | None:
    """A new cookie of ``session`` that lasts SESSION_TTL_S from ``now`` (never past the session's end), or None
    when it would last less than SESSION_RENEW_S longer than the current one (most requests set no cookie)."""
    expires = min(int(time.time() if now is None else now) + SESSION_TTL_S, session.ends)
    if expires < session.expires + SESSION_RENEW_S:
        return None
    return _cookie(config, session.role, session.session_id, session.started, expires)


def read_session(config: GatewayConfig, value: str | None, now: float | None = None) -> Session | None:
    """The session of a cookie value, or None when it is missing, forged, expired or of another role. Whether it
    was signed out is the database's to say (``awp.ui_session_revoked``, checked by every route that reads it)."""
    if not value or len(value) > 512 or not value.isascii():  # a cookie we set is ASCII (bytes not UTF-8: surrogates)
        return None
    parts = value.split(".")
    if len(parts) != 5:
        return None
    role_name, started, expires, session_id, signature = parts
    if role_name not in (Role.VIEWER.value, Role.OPERATOR.value) or not (started.isdigit() and expires.isdigit()):
        return None
    role = Role(role_name)
    key = _role_key(config, role)
    expected = _signature(key, f"{role_name}.{started}.{expires}.{session_id}")
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        return None
    at = time.time() if now is None else now
    if at >= int(expires) or at >= int(started) + SESSION_MAX_S:
        return None
    return Session(role, session_id, int(started), int(expires), _csrf(key, session_id))


def set_session_cookie(request: web.Request, response: web.StreamResponse, value: str, max_age: int) -> None:
    response.set_cookie(
        COOKIE, value, max_age=max_age, path="/ui", httponly=True, samesite="Strict", secure=is_tls(request)
    )


def is_tls(request: web.Request) -> bool:
    return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def cross_site(request: web.Request) -> bool:
    """Whether a POST comes from another site (the browser says so in Sec-Fetch-Site or Origin)."""
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return True
    origin = request.headers.get("Origin")
    return origin is not None and urlsplit(origin).netloc != request.host


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a path under /ui/ only (never another host), printable ASCII (a CR or LF
    would break the Location header)."""
    if value and value.startswith("/ui/") and "\\" not in value and value.isascii() and value.isprintable():
        return value
    return "/ui/runs"


# -- formatting ----------------------------------------------------------------------------------------


def _utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)


def fmt_ts(value: dt.datetime | None, with_date: bool = True, ms: bool = False) -> Markup:
    if value is None:
        return Markup("<span class=muted>—</span>")
    v = _utc(value)
    text = v.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S")
    if ms:
        text += f".{v.microsecond // 1000:03d}"
    iso = v.isoformat(timespec="milliseconds")
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(iso, text)


def fmt_seconds(seconds: float) -> str:
    if seconds < 0:
        seconds = 0
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} m"
    return f"{s // 86400} d {s % 86400 // 3600:02d} h"


def fmt_duration(start: dt.datetime | None, end: dt.datetime | None, now: dt.datetime) -> str:
    if start is None:
        return "—"
    return fmt_seconds(((end or now) - start).total_seconds())


def fmt_age(value: dt.datetime | None, now: dt.datetime) -> str:
    if value is None:
        return "never"
    return fmt_seconds((now - value).total_seconds()) + " ago"


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=False)
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more characters)"


def progress(counts: dict[str, int], width: int = 160) -> dict[str, Any]:
    """Segments of a stacked bar of tasks by status, and the totals."""
    total = sum(counts.values())
    segments = []
    x = 0.0
    for status in TASK_STATUSES:
        n = counts.get(status, 0)
        w = width * n / total if total else 0
        segments.append({"status": status, "n": n, "x": round(x, 2), "w": round(w, 2)})
        x += w
    done = sum(counts.get(s, 0) for s in ("succeeded", "failed", "canceled", "skipped"))
    return {"total": total, "done": done, "segments": segments, "width": width}


def task_url(run_id: str, key: str) -> str:
    return f"/ui/runs/{quote(run_id, safe='')}/tasks/{quote(key, safe='')}"


def run_task_url(run_id: str, key: str, ipage: int | None = None) -> str:
    """The run page with ``key``'s task panel open (on page ``ipage`` of its instances, 0-based, when given): a link
    that works without the script, which opens the panel in place instead."""
    query = {"task": key} if ipage is None else {"task": key, "ipage": ipage + 1}
    return f"/ui/runs/{quote(run_id, safe='')}?" + urlencode(query)


def run_url(run_id: str) -> str:
    return f"/ui/runs/{quote(run_id, safe='')}"


def status_text(status: str, skip_reason: str | None = None) -> str:
    """A task's status in words; a skipped one's says why: "skipped (condition false)"."""
    words = status.replace("_", " ")
    if status == "skipped" and skip_reason:
        return f"{words} ({SKIP_REASONS.get(skip_reason, skip_reason.replace('_', ' '))})"
    return words


def json_island(value: Any) -> Markup:
    """JSON for a <script type=application/json> block (no "</" can end it early)."""
    return Markup(dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


# -- rendering -----------------------------------------------------------------------------------------


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("awp.server.ui", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.globals.update(
        ts=fmt_ts,
        duration=fmt_duration,
        age=fmt_age,
        preview=preview,
        progress=progress,
        task_url=task_url,
        run_task_url=run_task_url,
        run_url=run_url,
        status_text=status_text,
        instances_page=INSTANCES_PAGE,
        quote=lambda s: quote(str(s), safe=""),
        glyph=GLYPH,
        task_statuses=TASK_STATUSES,
        run_statuses=RUN_STATUSES,
        json_island=json_island,
        live_run=LIVE_RUN,
        max_edges=dag.MAX_EDGES,
        signals={name: json.dumps(payload) for name, payload in SIGNALS.items()},
        rerun_statuses=RERUN_STATUSES,
    )
    return env


def _load_static() -> dict[str, tuple[bytes, str, str]]:
    files: dict[str, tuple[bytes, str, str]] = {}
    for entry in resources.files("awp.server.ui").joinpath("static").iterdir():
        if entry.is_file():
            body = entry.read_bytes()
            ctype = mimetypes.guess_type(entry.name)[0] or "application/octet-stream"
            if entry.name.endswith(".js"):
                ctype = "text/javascript"
            files[entry.name] = (body, ctype, hashlib.sha256(body).hexdigest()[:12])
    return files


def render_html(app: web.Application, template: str, **context: Any) -> bytes:
    static = app[STATIC]

    def static_url(name: str) -> str:
        return f"/ui/static/{name}?v={static[name][2]}"

    return app[TEMPLATES].get_template(template).render(static_url=static_url, **context).encode()


def render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    html = render_html(request.app, template, **context)
    return web.Response(body=html, status=status, content_type="text/html", charset="utf-8")


async def off_loop(request: web.Request, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``work(*args, **kwargs)`` in the dashboard's render thread (:data:`RENDERER`)."""
    call = functools.partial(work, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(request.app[RENDERER], call)


def _secure_headers(response: web.StreamResponse) -> None:
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Cache-Control", "no-store")


def redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


# -- route registration --------------------------------------------------------------------------------

UiHandler = Callable[[web.Request, Session | None], Awaitable[web.StreamResponse]]
UI_ROUTES: list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = []


def ui_route(method: str, path: str, kind: str = "page") -> Callable[[UiHandler], UiHandler]:
    """``kind``: ``page`` (HTML; signed out: redirect to the sign-in form), ``part`` (HTML or JSON fetched by
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
        UI_ROUTES.append((method, path, guarded))
        return handler

    return register


def setup_ui(app: web.Application) -> None:
    """Add the dashboard's routes to the gateway's application."""
    app[TEMPLATES] = _environment()
    app[STATIC] = _load_static()
    app[RECENT] = RecentRuns()
    app[RENDERER] = ThreadPoolExecutor(1, thread_name_prefix="awp-ui-render")
    for method, path, handler in UI_ROUTES:
        app.router.add_route(method, path, handler, name=handler.__name__)

    async def stop_renderer(app: web.Application) -> None:
        app[RENDERER].shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(stop_renderer)


# -- sign-in -------------------------------------------------------------------------------------------


SIGN_IN_ERRORS = {
    "wrong": "Wrong token: sign in with the viewer or the operator token.",
    "empty": "Enter a token.",
}


@ui_route("GET", "/ui", kind="open")
async def root(request: web.Request, session: Session | None) -> web.StreamResponse:
    return redirect("/ui/")


@ui_route("GET", "/ui/", kind="public")
async def sign_in_form(request: web.Request, session: Session | None) -> web.StreamResponse:
    next_url = safe_next(request.query.get("next"))
    if session is not None:
        return redirect(next_url)
    message = SIGN_IN_ERRORS.get(request.query.get("error", ""))
    return render(request, "login.html", session=None, next_url=next_url, message=message, nav="")


FORM_LIMIT = 64 * 1024  # a sign-in or a cancel form is a few hundred bytes


async def read_form(request: web.Request) -> MultiDictProxy[str | bytes | bytearray | web.FileField]:
    """The posted form (at most 64 KiB, else 413); 400 when it cannot be read (bytes that are not UTF-8, a broken
    multipart body)."""
    if request.content_length is not None and request.content_length > FORM_LIMIT:
        raise ApiError.of(413, f"the form exceeds {FORM_LIMIT} bytes")
    try:
        return await request.post()
    except (ValueError, HttpProcessingError, web.RequestPayloadError) as e:  # UnicodeDecodeError is a ValueError
        raise ApiError.of(400, f"the form cannot be read: {type(e).__name__}") from None
    except ConnectionResetError:  # the client hung up mid-body: nobody reads this answer
        raise ApiError.of(400, "the form is incomplete: the connection closed") from None


@ui_route("POST", "/ui/login", kind="open")
async def sign_in(request: web.Request, session: Session | None) -> web.StreamResponse:
    if cross_site(request):
        raise ApiError.of(403, "a sign-in from another site is refused")
    form = await read_form(request)
    token = str(form.get("token", "")).strip()
    next_url = safe_next(str(form.get("next", "")))
    config = request.app[CONFIG]
    role = role_of(config, token) if token else None
    if role not in (Role.VIEWER, Role.OPERATOR):
        # Back to the form with the message (post/redirect/get: a reload does not post the token again, and
        # the browser logs no failed load). Worker tokens (bootstrap or session) are wrong tokens here.
        return redirect("/ui/?" + urlencode({"error": "wrong" if token else "empty", "next": next_url}))
    assert role is not None
    response = redirect(next_url)
    set_session_cookie(request, response, new_session(config, role), SESSION_TTL_S)
    return response


async def _check_csrf(
    request: web.Request, session: Session
) -> MultiDictProxy[str | bytes | bytearray | web.FileField]:
    if cross_site(request):
        raise ApiError.of(403, "a request from another site is refused")
    form = await read_form(request)
    token = str(form.get("csrf_token", ""))
    if not hmac.compare_digest(token.encode(), session.csrf.encode()):
        raise ApiError.of(403, "missing or wrong CSRF token: reload the page and try again")
    return form


@ui_route("POST", "/ui/logout")
async def sign_out(request: web.Request, session: Session | None) -> web.StreamResponse:
    assert session is not None
    await _check_csrf(request, session)
    await request.app[DB].revoke_ui_session(session.session_id, session.ends)  # every cookie of it, every replica
    response = redirect("/ui/")
    response.del_cookie(COOKIE, path="/ui")
    return response


# -- static files --------------------------------------------------------------------------------------


@ui_route("GET", "/ui/static/{name}", kind="open")
async def static_file(request: web.Request, session: Session | None) -> web.StreamResponse:
    entry = request.app[STATIC].get(request.match_info["name"])
    if entry is None:
        raise ApiError.of(404, "no such file")
    body, ctype, etag = entry
    headers = {"ETag": f'"{etag}"', "Cache-Control": "public, max-age=31536000, immutable"}
    if "v" not in request.query:
        headers["Cache-Control"] = "no-cache"
    if request.headers.get("If-None-Match") == f'"{etag}"':
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, content_type=ctype, headers=headers)


# -- runs ----------------------------------------------------------------------------------------------


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _page_number(value: str | None) -> int:
    """A 1-based page number from the query (anything else: the first page), 0-based."""
    if value and value.isascii() and value.isdigit() and 0 < int(value) < 10**6:
        return int(value) - 1
    return 0


def _query(request: web.Request, name: str, max_len: int = 256) -> str | None:
    value = request.query.get(name, "").strip()
    if not value:
        return None
    if len(value) > max_len or "\x00" in value:
        raise ApiError.of(400, f"invalid {name}")
    return value


def _fragment_response(request: web.Request, response: web.Response) -> web.Response:
    """A fragment with an ETag; 304 when the page already has it."""
    body = response.body
    assert isinstance(body, bytes | bytearray), "a rendered fragment (text), not a payload"
    etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers={"ETag": etag})
    response.headers["ETag"] = etag
    return response


@ui_route("GET", "/ui/runs")
async def runs_page(request: web.Request, session: Session | None) -> web.StreamResponse:
    status = _query(request, "status")
    if status is not None and status not in RUN_STATUSES:
        raise ApiError.of(400, f"unknown run status {status!r}")
    workflow = _query(request, "workflow")
    after = _query(request, "after")
    db = request.app[DB]
    rows = await db.list_runs(workflow, status, after, RUNS_PAGE + 1)
    more = len(rows) > RUNS_PAGE
    rows = rows[:RUNS_PAGE]
    filters = {k: v for k, v in (("status", status), ("workflow", workflow)) if v}
    older = "/ui/runs?" + urlencode({**filters, "after": rows[-1]["run_id"]}) if more else None
    newest = "/ui/runs?" + urlencode(filters) if after else None
    context: dict[str, Any] = {
        "session": session,
        "runs": rows,
        "older": older,
        "newest": newest,
        "now": _now(),
        "nav": "runs",
    }
    if request.query.get("fragment"):
        return _fragment_response(request, render(request, "_runs_table.html", **context))
    workflows = [w["workflow_id"] for w in await db.list_workflows()]
    return render(request, "runs.html", status_filter=status, workflow_filter=workflow, workflows=workflows, **context)


async def latest_events(db: Any, run_id: str, n: int) -> tuple[list[dict[str, Any]], int]:
    """The last ``n`` events of a run (oldest first) and the last sequence, through ``awp.run_events`` only.

    Sequences are contiguous from 1, so the last one is found with a galloping then binary search on
    "is there an event after k" (one indexed row each): about 2·log2(events) tiny queries."""

    async def after(k: int) -> bool:  # is the last sequence > k?
        return bool(await db.run_events(run_id, k, 1))

    if not await after(0):
        return [], 0
    hi = 1
    while await after(hi):
        hi *= 2
    lo = hi // 2  # the last sequence is in (lo, hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await after(mid):
            lo = mid
        else:
            hi = mid
    last = hi
    rows = await db.run_events(run_id, max(0, last - n), n)
    return rows, (rows[-1]["sequence"] if rows else last)


@dataclass
class RunView:
    """What the run page draws: the DAG (all of it, or one page of it plus an overview)."""

    drawing: dag.Drawing
    overview: dag.Overview | None
    page: int
    pages: int
    shown_from: int
    shown_to: int
    matching: int
    total: int
    # per mapped task, its instances' statuses in index order, one character each (dag.status_digits)
    instances: dict[str, str] = field(default_factory=dict)


def instance_statuses(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Per mapped task of ``rows`` (``awp.run_tasks``), its instances' statuses in index order as one character each
    (the index in TASK_STATUSES, base 36): what the page's script counts the succeeded ones from."""
    digit = dag.status_digits(TASK_STATUSES)
    codes: dict[str, list[str]] = {}
    for r in rows:
        mapped = r.get("mapped_task")
        if mapped is not None:
            codes.setdefault(mapped, []).append(digit.get(r["status"], "z"))  # rows are in index order
    return {k: "".join(v) for k, v in codes.items()}


def run_view(rows: list[dict[str, Any]], page: int, status: str | None, page_size: int = dag.PAGE_SIZE) -> RunView:
    """The graph of ``rows`` (``awp.run_tasks``): the instances of mapped tasks are not drawn (dag.tasks_from_rows),
    their statuses are counted instead (:func:`instance_statuses`)."""
    layered = dag.layer(dag.tasks_from_rows(rows))
    instances = instance_statuses(rows)
    total = len(layered.tasks)
    if total <= page_size and status is None:
        return RunView(dag.draw(layered), None, 0, 1, 1 if total else 0, total, total, total, instances)
    keys = layered.order if status is None else [k for k in layered.order if layered.tasks[k].status == status]
    cut = dag.pages(layered, page_size, keys)
    page = min(max(page, 0), len(cut) - 1)
    shown = cut[page]
    start = page * page_size
    over = dag.overview(layered, page_size) if total > page_size else None
    return RunView(
        dag.draw(layered, shown),
        over,
        page,
        len(cut),
        start + 1 if shown else 0,
        start + len(shown),
        len(keys),
        total,
        instances,
    )


@dataclass
class Instances:
    """One page of a mapped task's instances, for its task panel."""

    rows: list[dict[str, Any]]  # awp.run_tasks rows (the first one may be awp.get_task's), in index order
    page: int  # 0-based
    pages: int
    count: int  # every instance of the task
    succeeded: int

    @property
    def first(self) -> int:
        """The index of the page's first instance."""
        return self.page * INSTANCES_PAGE


async def read_instances(db: Any, run_id: str, task: dict[str, Any], page: int) -> Instances | None:
    """Page ``page`` (0-based, clamped) of a mapped task's instances, or None for a task that has none (not mapped,
    or not yet expanded). Instances ``<key>[0..n-1]`` are created together, after every other task of the run and
    in index order (db/functions/_dynamic.sql, awp._expand_for_each), so page p is the ``awp.run_tasks`` page after
    ``<key>[p*50-1]``; the first page starts with ``<key>[0]`` itself (``awp.get_task``). Two reads of at most 50
    rows, whatever the number of instances (on a live run each also ranks what holds its waiting tasks, as every
    ``awp.run_tasks`` call does: 45 ms for a page of a run with 10,000 waiting instances, 40 ms for the last page of
    a run with 3,000 through the gateway, on this project's machine)."""
    count = task.get("item_count")
    if count is None:
        return None
    key = task["task_key"]
    pages = max(1, math.ceil(count / INSTANCES_PAGE))
    page = min(max(page, 0), pages - 1)
    start = page * INSTANCES_PAGE
    limit = min(INSTANCES_PAGE, count - start)
    rows: list[dict[str, Any]] = []
    if limit > 0 and start == 0:
        rows = [await db.get_task(run_id, f"{key}[0]")]
        if limit > 1:
            rows += await db.run_tasks(run_id, f"{key}[0]", limit - 1)
    elif limit > 0:
        rows = await db.run_tasks(run_id, f"{key}[{start - 1}]", limit)
    rows = [r for r in rows if r.get("mapped_task") == key]
    return Instances(rows, page, pages, count, int(task.get("instances_succeeded") or 0))


async def _workers_by_id(db: Any) -> dict[str, dict[str, Any]]:
    return {w["worker_id"]: w for w in await db.list_workers()}


def _signal_name(value: Any) -> str | None:
    """``approve`` or ``reject`` (a key of :data:`SIGNALS`), else None."""
    return value if isinstance(value, str) and value in SIGNALS else None


def signal_view(task: dict[str, Any], query: Any) -> dict[str, Any]:
    """What the task panel's signal part shows, from the query of the page (or of the script's request):
    ``confirm=approve|reject`` opens the confirmation step (python/awp/server/ui/templates/_task.html), ``sent=…`` and
    ``refused=…`` (where :func:`signal_task` redirects) a notice of the outcome. A notice is shown only when the task
    bears it out (a ``sent`` task's output is that payload, a ``refused`` task does not wait for a signal), so a
    link with such a query cannot make the panel claim what did not happen."""
    confirm = _signal_name(query.get("confirm"))
    notice: dict[str, str] | None = None
    sent, refused = _signal_name(query.get("sent")), _signal_name(query.get("refused"))
    if sent is not None and task.get("output") == SIGNALS[sent]:
        notice = {
            "outcome": "sent",
            "signal": sent,
            "text": f"{SIGNAL_DONE[sent]}: the task received {json.dumps(SIGNALS[sent])} and succeeded with it as "
            "its output.",
        }
    elif refused is not None and task.get("wait_reason") != "waiting_signal":
        if task["executor"] != "signal":
            why = f"its executor is {task['executor']}"
        elif task["status"] != "running":
            why = f"its status is {status_text(task['status'], task.get('skip_reason'))}"
        else:
            why = "its run is being canceled or has ended"
        notice = {
            "outcome": "refused",
            "signal": refused,
            "text": f"{SIGNAL_NOT_DONE[refused]}: the task is not waiting for a signal ({why}), so nothing was "
            "sent. Someone may have signalled it first, or its wait timed out or its run was canceled.",
        }
    return {"confirm": confirm, "notice": notice}


def rerun_view(run: dict[str, Any], query: Any) -> dict[str, Any]:
    """What the run summary's Re-run part shows, from the query of the page: ``rerun=confirm`` opens the
    confirmation step (python/awp/server/ui/templates/_run_summary.html) while the run can be re-run, ``rerun=refused``
    (where :func:`retry_run` redirects after AWREQ) a notice, only while the run bears it out (it is not failed or
    canceled), so a link with such a query cannot make the page claim what did not happen."""
    step = query.get("rerun")
    notice = None
    if step == "refused" and run["status"] not in RERUN_STATUSES:
        notice = (
            f"Not re-run: the run is {run['status']}, not failed or canceled, so nothing was changed. Someone may "
            "have re-run it first."
        )
    return {"confirm": step == "confirm" and run["status"] in RERUN_STATUSES, "notice": notice}


def cancel_view(run: dict[str, Any], query: Any) -> dict[str, Any]:
    """What the run summary's Cancel part shows: ``cancel=confirm`` (where :func:`cancel_run` redirects a first,
    unconfirmed post) opens the confirmation step (python/awp/server/ui/templates/_run_summary.html) while the run can
    still be canceled (live, no cancel requested yet)."""
    live = run["status"] in LIVE_RUN and not run.get("cancel_requested_at")
    return {"confirm": query.get("cancel") == "confirm" and live}


async def _task_context(db: Any, run_id: str, task_key: str, ipage: int = 0, query: Any = None) -> dict[str, Any]:
    """What the task panel shows: the task, its attempts, for a mapped task page ``ipage`` of its instances, and
    the state of its signal buttons (:func:`signal_view`, from ``query``)."""
    task = await db.get_task(run_id, task_key)
    for attempt in task["attempt_history"]:  # jsonb: timestamps arrive as ISO strings
        for name in ("started_at", "finished_at", "deadline"):
            if isinstance(attempt.get(name), str):
                attempt[name] = dt.datetime.fromisoformat(attempt[name])
    return {
        "task": task,
        "instances": await read_instances(db, run_id, task, ipage),
        "workers": await _workers_by_id(db),
        "run_id": run_id,
        "now": _now(),
        "signal": signal_view(task, query or {}),
    }


@ui_route("GET", "/ui/runs/{run_id}")
async def run_page(request: web.Request, session: Session | None) -> web.StreamResponse:
    run_id = request.match_info["run_id"]
    db = request.app[DB]
    status = _query(request, "status")
    if status is not None and status not in TASK_STATUSES:
        raise ApiError.of(400, f"unknown task status {status!r}")
    page = _page_number(request.query.get("page"))
    # Events first, tasks second: the tasks then include every change up to the last event shown, and the page
    # replays the changes after it (replaying one already included is harmless: statuses are set, not shifted).
    run = await db.get_run(run_id)
    events, last_sequence = await latest_events(db, run_id, TIMELINE)
    rows = await db.run_tasks(run_id)
    view = await off_loop(request, run_view, rows, page, status)  # the layout: up to 10,000 tasks
    selected = _query(request, "task", 1024)
    ipage = _page_number(request.query.get("ipage"))
    task_context = await _task_context(db, run_id, selected, ipage, request.query) if selected else None
    base = {k: v for k, v in (("status", status),) if v}

    def page_url(p: int) -> str:
        return f"/ui/runs/{quote(run_id, safe='')}?" + urlencode({**base, "page": p + 1})

    state = {
        "run_id": run_id,
        "revision": run["revision"],
        "status": run["status"],
        "after": last_sequence,
        "timeline": TIMELINE,
        "glyph": GLYPH,
        "statuses": TASK_STATUSES,
        "bands": view.overview.members if view.overview else None,
        # per band, one character per task: its status, as an index into "statuses"
        "band_status": view.overview.status_codes(TASK_STATUSES) if view.overview else None,
        # per mapped task, its instances' statuses (same characters): the script keeps each node's count live
        "mapped": view.instances,
        "instances_page": INSTANCES_PAGE,
    }
    html = await off_loop(
        request,
        render_html,
        request.app,
        "run.html",
        session=session,
        run=run,
        view=view,
        events=list(reversed(events)),
        page_url=page_url,
        task_status=status,
        state=state,
        task_ctx=task_context,
        rerun=rerun_view(run, request.query),
        cancel_step=cancel_view(run, request.query),
        now=_now(),
        nav="runs",
    )
    return web.Response(body=html, content_type="text/html", charset="utf-8")


def _event(e: dict[str, Any]) -> dict[str, Any]:
    return {
        "sequence": e["sequence"],
        "entity_type": e["entity_type"],
        "entity_key": e["entity_key"],
        "from_status": e["from_status"],
        "to_status": e["to_status"],
        "reason": e["reason"],
        "time": _utc(e["occurred_at"]).strftime("%H:%M:%S.%f")[:-3],
        "at": _utc(e["occurred_at"]).isoformat(timespec="milliseconds"),
    }


@ui_route("GET", "/ui/runs/{run_id}/changes", kind="part")
async def run_changes(request: web.Request, session: Session | None) -> web.StreamResponse:
    run_id = request.match_info["run_id"]
    revision = request.query.get("revision", "")
    after_arg = request.query.get("after", "0")
    if not after_arg.isdigit() or len(after_arg) > 18:
        raise ApiError.of(400, "after must be an event sequence number")
    db = request.app[DB]
    head = await db.run_revision(run_id)  # every tab polls twice a second: get_run's task counts only on a change
    if revision == str(head["revision"]):
        return _json({"revision": head["revision"], "status": head["status"], "unchanged": True})

    async def read() -> tuple[dict[str, Any], dict[str, str] | None]:
        run = await db.get_run(run_id)
        # What holds each waiting task, for the graph's node titles ("reason: detail"; docs/limits.md): only while
        # few tasks wait, so a big run's answers stay small (its nodes then show their status alone).
        counts = run.get("task_counts") or {}
        if run["status"] in LIVE_RUN and sum(int(counts.get(s, 0)) for s in WAITING_TASK) <= WAITS_LIMIT:
            return run, {w["task_key"]: f"{w['reason']}: {w['detail']}" for w in await db.run_waits(run_id)}
        return run, None

    run, waits = await request.app[RECENT].read(run_id, head["status"], read)  # a big run's: shared a moment
    answer: dict[str, Any] = {"revision": run["revision"], "status": run["status"]}
    rows = await db.run_events(run_id, int(after_arg), CHANGES_LIMIT + 1)
    answer["more"] = len(rows) > CHANGES_LIMIT
    rows = rows[:CHANGES_LIMIT]
    answer["events"] = [_event(e) for e in rows]
    answer["after"] = rows[-1]["sequence"] if rows else int(after_arg)
    answer["summary"] = render_html(
        request.app,
        "_run_summary.html",
        session=session,
        run=run,
        rerun=rerun_view(run, {}),
        cancel_step=cancel_view(run, {}),
        now=_now(),
    ).decode()
    if waits is not None:
        answer["waits"] = waits
    return _json(answer)


LOG_TAIL_PAGE = 500  # entries the task panel's log tail asks for at once


def _json(value: Any) -> web.Response:
    return web.Response(text=dumps(value), content_type="application/json", headers={"Cache-Control": "no-store"})


@ui_route("GET", "/ui/runs/{run_id}/tasks/{task_key}", kind="part")
async def task_part(request: web.Request, session: Session | None) -> web.StreamResponse:
    run_id, task_key = request.match_info["run_id"], request.match_info["task_key"]
    ipage = _page_number(request.query.get("ipage"))
    context = await _task_context(request.app[DB], run_id, task_key, ipage, request.query)
    return render(request, "_task.html", session=session, **context)


@ui_route("GET", "/ui/runs/{run_id}/tasks/{task_key}/logs", kind="part")
async def task_logs_part(request: web.Request, session: Session | None) -> web.StreamResponse:
    """The task panel's live log tail (docs/progress.md): ``awp.task_logs`` after ``after``, as JSON."""
    run_id, task_key = request.match_info["run_id"], request.match_info["task_key"]
    after = request.query.get("after", "0")
    if not after.isascii() or not after.isdigit() or len(after) > 18:
        raise ApiError.of(400, "after must be a sequence number")
    return _json(await request.app[DB].task_logs(run_id, task_key, None, int(after), LOG_TAIL_PAGE))


@ui_route("POST", "/ui/runs/{run_id}/cancel")
async def cancel_run(request: web.Request, session: Session | None) -> web.StreamResponse:
    """Cancel from a live run's summary (python/awp/server/ui/templates/_run_summary.html). Two steps, as Re-run's
    (:func:`retry_run`): without ``confirmed=yes`` nothing changes, the answer is the run page with the
    confirmation step (``?cancel=confirm``; the page's script shows that step in place); with it,
    ``awp.request_cancel``, then the run page."""
    assert session is not None
    form = await _check_csrf(request, session)
    if not session.operator:
        raise ApiError.of(403, "only the operator may cancel a run; you signed in with the viewer token")
    run_id = request.match_info["run_id"]
    if form.get("confirmed") != "yes":
        return redirect(run_url(run_id) + "?" + urlencode({"cancel": "confirm"}))
    await request.app[DB].request_cancel(run_id)
    return redirect(f"/ui/runs/{quote(run_id, safe='')}")


@ui_route("POST", "/ui/runs/{run_id}/retry")
async def retry_run(request: web.Request, session: Session | None) -> web.StreamResponse:
    """Re-run from a failed or canceled run's summary (python/awp/server/ui/templates/_run_summary.html), refused as a
    cancel is (:func:`cancel_run`: CSRF token, same origin, operator only). Two steps, as a signal's
    (:func:`signal_task`): without ``confirmed=yes`` nothing changes, the answer is the run page with the
    confirmation step (``?rerun=confirm``; the page's script shows that step in place); with it,
    ``awp.retry_run`` of the whole run, then the run page (the run is running again). AWREQ because the run is no
    longer failed or canceled (re-run already, e.g. a second click or another operator first): the run page with
    a notice saying so (``?rerun=refused``); an AWREQ for another reason (a for_each task among those to re-run)
    is the error page with the database's message."""
    assert session is not None
    form = await _check_csrf(request, session)
    if not session.operator:
        raise ApiError.of(403, "only the operator may re-run a run; you signed in with the viewer token")
    run_id = request.match_info["run_id"]
    if form.get("confirmed") != "yes":
        return redirect(run_url(run_id) + "?" + urlencode({"rerun": "confirm"}))
    db = request.app[DB]
    try:
        await db.retry_run(run_id, None)
    except psycopg.Error as e:
        if e.sqlstate != "AWREQ":  # invalid_request (python/awp/server/errors.py); anything else is answered as usual
            raise
        if (await db.get_run(run_id))["status"] in RERUN_STATUSES:
            raise  # refused for what the run holds, not for its status: the error page gives the reason
        return redirect(run_url(run_id) + "?" + urlencode({"rerun": "refused"}))
    return redirect(run_url(run_id))


@ui_route("POST", "/ui/runs/{run_id}/tasks/{task_key}/signal")
async def signal_task(request: web.Request, session: Session | None) -> web.StreamResponse:
    """Approve or Reject from a task panel (python/awp/server/ui/templates/_task.html): the form posts ``signal`` =
    ``approve`` or ``reject``, refused as a cancel is (:func:`cancel_run`: CSRF token, same origin, operator only).
    Two steps: without ``confirmed=yes`` nothing is sent, the answer is the panel's confirmation step
    (``?confirm=…``); with it, ``awp.send_signal`` with the payload of :data:`SIGNALS` (no idempotency key), then
    the run page with the panel open and the outcome (``?sent=…``, or ``?refused=…`` when the task no longer waits:
    AWSIG, e.g. a second click or another operator first). The page's script posts the second step with
    ``fragment=1`` and gets the refreshed panel itself (200 either way: the notice in it says what happened)."""
    assert session is not None
    form = await _check_csrf(request, session)
    if not session.operator:
        raise ApiError.of(403, "only the operator may approve or reject a task; you signed in with the viewer token")
    run_id, task_key = request.match_info["run_id"], request.match_info["task_key"]
    name = _signal_name(form.get("signal"))
    if name is None:
        raise ApiError.of(400, "signal must be approve or reject")
    if form.get("confirmed") != "yes":
        return redirect(run_task_url(run_id, task_key) + "&" + urlencode({"confirm": name}))
    db = request.app[DB]
    outcome = "sent"
    try:
        await db.send_signal(run_id, task_key, SIGNALS[name], None)
    except psycopg.Error as e:
        if (
            e.sqlstate != "AWSIG"
        ):  # signal_not_waiting (python/awp/server/errors.py); anything else is answered as usual
            raise
        outcome = "refused"
    if form.get("fragment") == "1":
        context = await _task_context(db, run_id, task_key, 0, {outcome: name})
        return render(request, "_task.html", session=session, **context)
    return redirect(run_task_url(run_id, task_key) + "&" + urlencode({outcome: name}))


# -- workers -------------------------------------------------------------------------------------------


@ui_route("GET", "/ui/workers")
async def workers_page(request: web.Request, session: Session | None) -> web.StreamResponse:
    rows = await request.app[DB].list_workers()
    rows.sort(key=lambda w: (WORKER_ORDER.get(w["status"], 9), -w["registered_at"].timestamp(), w["worker_id"]))
    counts = {s: sum(1 for w in rows if w["status"] == s) for s in WORKER_ORDER}
    context: dict[str, Any] = {"session": session, "workers": rows, "counts": counts, "now": _now(), "nav": "workers"}
    if request.query.get("fragment"):
        return _fragment_response(request, render(request, "_workers_table.html", **context))
    return render(request, "workers.html", **context)
