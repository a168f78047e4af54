"""The gateway's one middleware: every answer carries ``X-Request-Id`` and ``X-Content-Type-Options: nosniff``;
errors (:class:`awp.server.errors.ApiError`, aiohttp's HTTP exceptions, database errors through the table in
:mod:`awp.server.errors`) become the envelope ``{"error": {code, message, request_id}}``; each request is logged once
and
counted. A request body that does not arrive within the body timeout is cut (408); a 401 is counted, and answered
late to a source that keeps failing (:mod:`awp.server.authfail`)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable

import psycopg
import psycopg_pool
from aiohttp import web

from awp.protocol.limits import PROTOCOL_HEADER, PROTOCOL_VERSION
from awp.server.answers import json_response
from awp.server.appstate import AUTH_FAILURES, CONFIG, DB, METRICS
from awp.server.auth import bearer_token
from awp.server.errors import RETRY_AFTER_S, ApiError, from_database_error, is_timeout_error
from awp.server.parsing import BodyTimeout
from awp.server.pools import PoolSaturated

log = logging.getLogger("awp.gateway")
access_log = logging.getLogger("awp.gateway.access")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# A request id the gateway makes: 32 hex digits, a random prefix per process and a counter (unique without a
# uuid4 per request: a getrandom call and a UUID object each time).
_ID_PREFIX = os.urandom(10).hex()
_ID_COUNTER = itertools.count(1)


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER) % 16**12:012x}"


def error_response(error: ApiError, request_id: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"code": error.code, "message": error.message, "request_id": request_id}}
    response = json_response(body, status=error.status)
    if headers:
        response.headers.update(headers)
    if error.status == 503:  # always retryable: say when
        response.headers.setdefault("Retry-After", str(RETRY_AFTER_S))
    return response


def _route_label(request: web.Request) -> str:
    info = request.match_info
    resource = info.route.resource if info is not None and info.http_exception is None else None
    return resource.canonical if resource is not None else "unmatched"


def database_error(request: web.Request, e: psycopg.Error | psycopg_pool.PoolTimeout) -> ApiError:
    """The answer to a database error (through the table in :mod:`awp.server.errors`), logged once: a timeout or a
    saturated pool is a busy database (503, nothing else to do); a lost connection also has the pools
    checked; anything else is a bug (500, with its traceback in the log)."""
    request_id = request.get("request_id", "-")
    error = from_database_error(e)
    if error is None:
        log.error("request %s %s failed: %s", request_id, request.path, e, exc_info=e)
        return ApiError.of(500, "internal error; see the gateway log for request id " + request_id)
    if error.status == 503:
        if is_timeout_error(e):  # the database is up; a row or lock was held elsewhere for too long
            log.warning("request %s %s: %s", request_id, request.path, e)
        elif isinstance(e, PoolSaturated):  # every connection busy: the database may be fine
            log.warning("request %s %s: no free database connection (pool saturated)", request_id, request.path)
            error = ApiError.of(503, "every database connection of this gateway is busy; retry later")
        else:
            log.warning("request %s: database unavailable: %s", request_id, e)
            request.app[DB].connection_lost()
    return error


def _cut_slow_body(request: web.Request) -> None:
    """The body did not all arrive within the body timeout: its read fails (408 from
    :func:`awp.server.parsing.read_body`), and the connection closes after the answer (the rest of the body must not be
    read as a next request, nor waited for)."""
    if request.content.is_eof():
        return
    seconds = request.app[CONFIG].body_timeout_ms / 1000
    request.content.set_exception(BodyTimeout(f"the request body did not arrive within {seconds:g} s"))
    request.content.feed_eof()
    request.protocol.close()
    request.app[METRICS].http_timeouts.labels("body").inc()
    log.debug("request %s: cut a request body still incomplete after %g s", request.get("request_id"), seconds)


async def _authentication_failed(request: web.Request, code: str | None, route: str) -> None:
    """Count a 401, and hold its answer back when its source keeps failing (:mod:`awp.server.authfail`)."""
    if code == "worker_session_invalid":
        reason = "worker_session"
    else:
        reason = "missing" if bearer_token(request) is None else "invalid"
    request.app[METRICS].auth_failures.labels(reason).inc()
    delay = request.app[AUTH_FAILURES].failed(request.remote, reason, f"{request.method} {route}")
    if delay > 0:
        await asyncio.sleep(delay)  # this request's task only: other requests go on meanwhile


@web.middleware
async def api_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    incoming = request.headers.get("X-Request-Id", "")
    request_id = incoming if incoming and _REQUEST_ID.match(incoming) else new_request_id()
    request["request_id"] = request_id
    started = time.perf_counter()
    # A body not all there yet (rare: a small body comes with its head) gets a deadline.
    cut = None
    if not request.content.is_eof():
        timeout_s = request.app[CONFIG].body_timeout_ms / 1000
        cut = asyncio.get_running_loop().call_later(timeout_s, _cut_slow_body, request)
    code = None
    try:
        response = await handler(request)
    except ApiError as e:
        code = e.code
        response = error_response(e, request_id)
    except web.HTTPException as e:
        status = e.status if e.status in (404, 405, 413) else 400
        extra = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
        response = error_response(ApiError.of(status, e.reason), request_id, extra)
    except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
        error = database_error(request, e)
        code = error.code
        response = error_response(error, request_id)
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as e:
        log.error("request %s %s failed", request_id, request.path, exc_info=e)
        response = error_response(ApiError.of(500, "internal error; request id " + request_id), request_id)
    finally:
        if cut is not None:
            cut.cancel()
    response.headers["X-Request-Id"] = request_id
    response.headers["X-Content-Type-Options"] = "nosniff"  # JSON errors echo input: never sniffed as HTML
    if request.get("echo_protocol"):
        response.headers[PROTOCOL_HEADER] = str(PROTOCOL_VERSION)
    elapsed = time.perf_counter() - started
    label = _route_label(request)
    request.app[METRICS].observe_request(request.method, label, response.status, elapsed)
    if response.status == 401:
        await _authentication_failed(request, code, label)  # after the latency is taken: the delay is ours
    access_log.info(
        "request_id=%s method=%s route=%s status=%d duration_ms=%.1f",
        request_id,
        request.method,
        label,
        response.status,
        elapsed * 1000,
    )
    return response
