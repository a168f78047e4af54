"""The HTTP server under the gateway: aiohttp's, with what its own layer refuses answered like every other error.

aiohttp answers a request it cannot parse (a control character in a header, a bad header name, a malformed
``Content-Length`` or chunk size, a request line that is not HTTP) itself, before any application code runs: a
``text/plain`` 400 without ``X-Request-Id``, logging a full traceback at ERROR each time, so any client could
flood the log. :class:`GatewayRunner` (an :class:`aiohttp.web.AppRunner`; ``awp serve`` uses it) makes every
connection's protocol a :class:`GatewayRequestHandler`, which

- answers those requests with the error envelope and ``X-Request-Id`` (400 ``invalid_request``), logs each one as
  one DEBUG line plus one WARNING at most every :data:`WARN_EVERY_S` seconds counting them, and counts them in
  ``awp_http_requests_total{route="malformed"}``;
- fails a request body whose chunked framing breaks after the route started reading it (aiohttp would leave the
  route waiting until the client hangs up): :func:`awp.server.parsing.read_body` answers 400;
- logs a body that breaks while aiohttp drains it after the answer (bad gzip, bad chunks) as one line, not a
  traceback;
- ignores an ``Expect`` header other than ``100-continue`` (aiohttp answers it with a text/plain 417 before the
  middleware, a 500 when the value is not UTF-8; RFC 9110 allows ignoring it);
- closes a connection whose request head has not all arrived within the head timeout (``awp serve
  --head-timeout-ms``), counted from the connection's start or the first byte of a head on a kept-alive
  connection: an idle new connection, or one sending its head a byte at a time, would hold a socket (and a file
  descriptor) for as long as the client likes. The idle time between requests is aiohttp's keep-alive timeout
  (``--keepalive-timeout-ms``), the time for a body :mod:`awp.server.middleware`'s body timeout.

Why aiohttp's private hooks, and only here (pyproject.toml pins aiohttp to 3.14 for them). aiohttp 3.14 has no
public way to do any of the above: :class:`aiohttp.web.AppRunner` always builds a plain :class:`aiohttp.web.Server`
(``Application._make_handler``), whose protocol factory (``Server.__call__``) always makes a plain
:class:`aiohttp.web_protocol.RequestHandler`; the handler's settings (``AppRunner(**kwargs)``, ``handler_args``) are a
keep-alive timeout, line and header size limits, the access log and the like, with no hook for what the parser
refuses and no request-head timeout: the one timer on a connection waiting for a head is the keep-alive timeout
(from the connection's start or the end of the last answer), where the gateway wants a short head timeout (10 s)
apart from a longer idle keep-alive (75 s). So :meth:`GatewayRunner._make_server` (private) takes the server
AppRunner built and changes its class to one whose factory makes a :class:`GatewayRequestHandler` (from the
server's ``_loop`` and ``_kwargs``), and that handler reads aiohttp's ``_messages``, ``_waiter`` and
``_current_request`` and ``web_protocol._ErrInfo`` (the body-framing fix steps aside when they are not as
expected). No other module of the package reaches into aiohttp's internals.

The tests that hold it to the installed aiohttp: python/tests/faults/test_slow_clients.py (the head, body and
keep-alive timeouts through real sockets: an idle connection, a head or a next head sent a byte at a time),
python/tests/integration/test_hostile_input.py and test_raw_fuzz.py (what the parser refuses, the Expect header,
broken chunked bodies).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import time
from typing import Any

from aiohttp import hdrs, web, web_protocol
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from multidict import CIMultiDict, CIMultiDictProxy

from awp.logsafe import escape_controls
from awp.server.appstate import CONFIG, METRICS
from awp.server.errors import GATEWAY_ERRORS, ApiError
from awp.server.middleware import error_response, new_request_id

log = logging.getLogger("awp.gateway.http")

WARN_EVERY_S = 60.0
_ERR_INFO: type | None = getattr(web_protocol, "_ErrInfo", None)  # what aiohttp queues for a request it refused
ROUTE_LABEL = "malformed"


class RefusedRequests:
    """Counts requests the HTTP parser refused; logs each at DEBUG, and a WARNING at most every ``every_s``."""

    def __init__(self, every_s: float = WARN_EVERY_S) -> None:
        self.every_s = every_s
        self.total = 0
        self._unreported = 0
        self._last_warning: float | None = None

    def note(self, remote: str | None, reason: str) -> None:
        self.total += 1
        self._unreported += 1
        log.debug("refused a malformed HTTP request from %s: %s", remote, reason)
        now = time.monotonic()
        if self._last_warning is None or now - self._last_warning >= self.every_s:
            log.warning(
                "refused %d malformed HTTP request(s) since the last report (latest from %s: %s)",
                self._unreported,
                remote,
                reason,
            )
            self._unreported = 0
            self._last_warning = now


def _reason(exc: BaseException | None, message: str | None = None) -> str:
    """The first line of aiohttp's message ("Invalid header value char"), without the request bytes it echoes."""
    if message:
        text = message
    elif isinstance(exc, HttpProcessingError):
        text = exc.message
    else:
        text = str(exc or "")
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    lines = [line for line in lines if not re.fullmatch(r"\d{3}, message:?", line)]  # "400, message:" of a str()
    first = lines[0].rstrip(":").strip() if lines else ""
    return escape_controls(first or "malformed request")[:200]


class GatewayRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol, answering the requests it refuses with the error envelope."""

    refused: RefusedRequests
    app: web.Application | None
    head_timeout_s: float
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._head_timer = self._loop.call_later(self.head_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        waiting = self._head_timer is None and self._waiting_for_head()
        self._receive(data)
        if getattr(self, "_messages", None):  # a whole head arrived (or the parser refused it)
            self._stop_head_timer()
        elif waiting and data:  # part of the next head on a kept-alive connection: the rest is due in time
            self._head_timer = self._loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _waiting_for_head(self) -> bool:
        """aiohttp waits for the next request (and has none queued): bytes now are a request head's."""
        waiter = getattr(self, "_waiter", None)
        return isinstance(waiter, asyncio.Future) and not waiter.done() and not getattr(self, "_messages", True)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        """No complete head in time: close (unless a request came after all, or the connection is gone)."""
        self._head_timer = None
        if self.transport is None or not self._waiting_for_head():
            return
        log.debug(
            "closed a connection from %s: no complete request head within %g s", self.peername, self.head_timeout_s
        )
        if self.app is not None:
            self.app[METRICS].http_timeouts.labels("head").inc()
        self.force_close()  # no answer: the client may not even be reading

    def _receive(self, data: bytes) -> None:
        """aiohttp 3.14 drops a request body whose framing breaks after the route started reading it (garbage
        for a chunk size): the route would wait for the rest until the client hangs up. Fail that body instead
        (:func:`awp.server.parsing.read_body` answers 400) and close the connection after the answer. Only when
        aiohttp's internals look as expected; otherwise aiohttp's own behaviour stays."""
        request = getattr(self, "_current_request", None)
        messages = getattr(self, "_messages", None)
        if _ERR_INFO is None or not isinstance(request, BaseRequest) or not isinstance(messages, collections.deque):
            super().data_received(data)
            return
        queued = len(messages)
        super().data_received(data)
        if len(messages) <= queued:
            return
        error = messages[-1][0]
        if not isinstance(error, _ERR_INFO) or request.content.is_eof():
            return  # a later pipelined request is malformed, not this body: it gets its own answer
        messages.pop()
        reason = _reason(getattr(error, "exc", None), getattr(error, "message", None))
        self.refused.note(request.remote, reason)
        # A read waiting right now raises the exception; one that woke for the chunk before this data sees the
        # end of the body, and read_body finds the exception there.
        request.content.set_exception(web.RequestPayloadError(reason))
        request.content.feed_eof()
        self.close()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """A request body that breaks (bad chunked framing, a gzip body that does not decompress) while aiohttp
        drains it after the answer is the client's fault: one brief line, not a traceback at ERROR."""
        exc = kw.get("exc_info")
        if isinstance(exc, web.RequestPayloadError):
            self.refused.note(None, "broken request body: " + _reason(exc))
            return
        super().log_exception(*args, **kw)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500 or request.writer.output_size > 0:
            # A bug (an exception that escaped the middleware): aiohttp logs it with its traceback (and raises
            # ConnectionError when part of an answer was sent already); the answer still gets the envelope.
            super().handle_error(request, status, exc, message)
        request_id = new_request_id()
        code = GATEWAY_ERRORS.get(status) or ("internal_error" if status >= 500 else "invalid_request")
        if status < 500:
            reason = _reason(exc, message)
            self.refused.note(request.remote, reason)
            text = f"malformed HTTP request: {reason}"
        else:
            text = "internal error; request id " + request_id
        response = error_response(ApiError(status, code, text), request_id)
        response.headers["X-Request-Id"] = request_id
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.force_close()
        if self.app is not None:
            self.app[METRICS].observe_request("-", ROUTE_LABEL, status, 0.0)
        return response


class _GatewayServer(web.Server):
    refused: RefusedRequests
    app: web.Application | None
    head_timeout_s: float

    def __call__(self) -> RequestHandler:
        handler = GatewayRequestHandler(self, loop=self._loop, **self._kwargs)
        handler.refused = self.refused
        handler.app = self.app
        handler.head_timeout_s = self.head_timeout_s
        return handler


class GatewayRunner(web.AppRunner):
    """:class:`aiohttp.web.AppRunner` whose connections use :class:`GatewayRequestHandler`, with the head and
    keep-alive timeouts of the app's :class:`awp.server.appstate.GatewayConfig`."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        config = app[CONFIG]
        kwargs.setdefault("keepalive_timeout", config.keepalive_timeout_ms / 1000)
        super().__init__(app, **kwargs)
        self.refused = RefusedRequests()
        self.head_timeout_s = config.head_timeout_ms / 1000

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _GatewayServer  # the same object, only its protocol factory differs
        assert isinstance(server, _GatewayServer)
        server.refused = self.refused
        server.app = self.app
        server.head_timeout_s = self.head_timeout_s
        server.request_factory = _ignoring_unknown_expectations(server.request_factory)
        return server


def _ignoring_unknown_expectations(factory: Any) -> Any:
    """aiohttp answers an ``Expect`` header other than ``100-continue`` with a text/plain 417 before the
    middleware runs (a 500 when the value is not UTF-8). RFC 9110 lets a server ignore an expectation it does not
    know: the request goes on without the header."""

    def make_request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> BaseRequest:
        headers = getattr(message, "headers", None)
        expect = headers.get(hdrs.EXPECT) if headers is not None else None
        if headers is not None and expect is not None and expect.strip().lower() != "100-continue":
            kept = CIMultiDict((name, value) for name, value in headers.items() if name.lower() != "expect")
            raw = tuple((name, value) for name, value in message.raw_headers if name.lower() != b"expect")
            message = message._replace(headers=CIMultiDictProxy(kept), raw_headers=raw)
        request: BaseRequest = factory(message, payload, protocol, writer, task)
        return request

    return make_request
