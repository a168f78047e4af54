"""The dashboard's session cookie, its CSRF token and the forms that carry it.

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
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from multidict import MultiDictProxy

from awp.server.appstate import GatewayConfig
from awp.server.auth import Role
from awp.server.errors import ApiError

COOKIE = "awp_ui"
SESSION_TTL_S = 30 * 60  # a cookie's lifetime: the session ends after this long without a request...
SESSION_RENEW_S = 60  # ...as a request renews it once its cookie is this much older...
SESSION_MAX_S = 12 * 3600  # ...up to this long after the sign-in, however it is used


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


async def check_csrf(request: web.Request, session: Session) -> MultiDictProxy[str | bytes | bytearray | web.FileField]:
    """The form of a POST that changes something: 403 from another site or without ``session``'s CSRF token."""
    if cross_site(request):
        raise ApiError.of(403, "a request from another site is refused")
    form = await read_form(request)
    token = str(form.get("csrf_token", ""))
    if not hmac.compare_digest(token.encode(), session.csrf.encode()):
        raise ApiError.of(403, "missing or wrong CSRF token: reload the page and try again")
    return form
