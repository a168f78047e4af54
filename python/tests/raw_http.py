"""Raw HTTP/1.1 over a socket, for requests no HTTP client would send (bad bytes in headers, broken framing).

data = build("POST", "/api/v1/workers/register", [("Authorization", b"Bearer \\xff")], b"{}")
r = exchange(gw.port, data)          # RawResponse, or None when the server closed without an answer
check_envelope(r)                    # a 4xx with {"error": {code, message, request_id}} and X-Request-Id
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from awp.server.errors import ERROR_CODES

Header = tuple[str | bytes, str | bytes]


def _b(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def build(
    method: str | bytes,
    target: str | bytes,
    headers: Sequence[Header] = (),
    body: bytes | None = None,
    content_length: bool = True,
) -> bytes:
    """A request with ``Host`` and ``Connection: close``; ``Content-Length`` for ``body`` unless told not to."""
    lines = [_b(method) + b" " + _b(target) + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close"]
    lines += [_b(name) + b": " + _b(value) for name, value in headers]
    if body is not None and content_length:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return bytes(out)


def parse_response(raw: bytes) -> RawResponse | None:
    head, sep, body = _final(raw).partition(b"\r\n\r\n")
    if not sep:
        return None
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(body)
    elif "content-length" in headers:
        body = body[: int(headers["content-length"])]
    return RawResponse(int(status_line.split(" ")[1]), headers, body)


def _final(raw: bytes) -> bytes:
    """``raw`` without the interim answers before the final one (``HTTP/1.1 100 Continue``)."""
    while re.match(rb"HTTP/1\.[01] 1\d\d ", raw) and b"\r\n\r\n" in raw:
        raw = raw.split(b"\r\n\r\n", 1)[1]
    return raw


def _complete(raw: bytes) -> bool:
    """Whether ``raw`` holds one whole response (so a connection kept alive need not be waited out)."""
    head, sep, body = _final(raw).partition(b"\r\n\r\n")
    if not sep:
        return False
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        return body.endswith(b"0\r\n\r\n")
    for line in lower.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def receive(s: socket.socket) -> RawResponse | None:
    """Read one response: until it is complete, the server closes, or the socket's timeout passes."""
    data = b""
    try:
        while not _complete(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return parse_response(data)


def exchange(port: int, data: bytes, timeout: float = 30.0, half_close: bool = False) -> RawResponse | None:
    """Send ``data`` and read one response; with ``half_close`` the sending side is shut first (a truncated body
    ends there). None: the server closed (or said nothing for ``timeout`` seconds) without an answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may answer and close before reading everything (e.g. 413)
        return receive(s)


def check_envelope(r: RawResponse | None, status: int | None = None, code: str | None = None) -> dict[str, Any]:
    """Assert ``r`` is a 4xx (``status`` when given) with the error envelope (``code`` when given) whose
    request id is the X-Request-Id header; returns the error object."""
    assert r is not None, "the server closed the connection without an answer"
    assert 400 <= r.status < 500, (r.status, r.body[:300])
    if status is not None:
        assert r.status == status, (r.status, r.body[:300])
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    request_id = r.headers.get("x-request-id")
    assert request_id, r.headers
    try:
        error = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"not the error envelope: {r.status} {r.headers} {r.body[:300]!r}") from None
    assert set(error) == {"code", "message", "request_id"}, error
    assert error["request_id"] == request_id and error["code"] in ERROR_CODES and error["message"], error
    if code is not None:
        assert error["code"] == code, error
    return error
