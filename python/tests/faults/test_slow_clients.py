"""Slow clients cannot hold the gateway's sockets (issue 44): a real ``awp serve`` with short timeouts, and real
sockets that send nothing, send a request head or body a byte at a time, or keep a connection idle.

- ``--head-timeout-ms``: a connection without a complete request head that long after it opened (or after the
  first byte of a next head) is closed without an answer;
- ``--body-timeout-ms``: a body still incomplete that long after its head answers 408 ``request_timeout``, and
  the connection closes;
- ``--keepalive-timeout-ms``: a kept-alive connection idle that long is closed.

Every bound below is generous (the timeout plus :data:`SLACK_S`): the tests check that a connection ends, not how
fast a busy machine ends it.
"""

from __future__ import annotations

import secrets
import select
import socket
import subprocess
import sys
import threading
import time

import httpx
from raw_http import RawResponse, build, check_envelope, parse_response, receive

from awp_testing.gateway import ServeProcess, bearer

HEAD_S = 2.0
BODY_S = 2.0
KEEPALIVE_S = 4.0
SLACK_S = 10.0  # on top of a timeout: how long a busy machine may take to act on it
TRICKLE_S = 0.2  # between two bytes of a slow client


GATEWAY_OPTIONS = {
    "args": [
        "--head-timeout-ms",
        str(int(HEAD_S * 1000)),
        "--body-timeout-ms",
        str(int(BODY_S * 1000)),
        "--keepalive-timeout-ms",
        str(int(KEEPALIVE_S * 1000)),
    ]
}


def connect(gw: ServeProcess) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=HEAD_S + SLACK_S)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each trickled byte goes out on its own
    return s


def closed_by_server(s: socket.socket, within: float) -> bytes | None:
    """Everything the server sent until it closed the connection; None when it is still open after ``within``."""
    data = b""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            return None
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    return None


def trickle(s: socket.socket, data: bytes, within: float, send_for: float | None = None) -> tuple[int, bytes | None]:
    """Send ``data`` a byte every :data:`TRICKLE_S` (for ``send_for`` seconds at most, then nothing) until the
    server closes the connection: (bytes sent, what the server sent before closing); None for the latter when it
    is still open after ``within`` seconds."""
    started = time.monotonic()
    sent = 0
    while time.monotonic() - started < within:
        if sent < len(data) and (send_for is None or time.monotonic() - started < send_for):
            try:
                s.sendall(data[sent : sent + 1])
            except OSError:  # reset by the server
                return sent, b""
            sent += 1
        readable, _, _ = select.select([s], [], [], TRICKLE_S)
        if readable:
            return sent, closed_by_server(s, SLACK_S)
    return sent, None


def metric(gw: ServeProcess, name: str, labels: str) -> float:
    text = httpx.get(gw.url("/metrics"), timeout=10).text
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{labels}}} not in /metrics")


def live(gw: ServeProcess) -> httpx.Response:
    """A normal request on a fresh connection."""
    with httpx.Client(timeout=10) as client:
        return client.get(gw.url("/health/live"))


def test_an_idle_connection_is_closed_after_the_head_timeout(gw: ServeProcess) -> None:
    before = metric(gw, "awp_http_timeouts_total", 'phase="head"')
    sockets = [connect(gw) for _ in range(20)]
    started = time.monotonic()
    try:
        assert live(gw).status_code == 200  # the idle ones hold no one up
        for s in sockets:
            sent = closed_by_server(s, HEAD_S + SLACK_S)
            assert sent == b"", "an idle connection should be closed without an answer"
        assert time.monotonic() - started >= HEAD_S - 0.5  # by the head timeout, not at once
    finally:
        for s in sockets:
            s.close()
    assert metric(gw, "awp_http_timeouts_total", 'phase="head"') >= before + 20
    assert live(gw).status_code == 200


def test_a_head_sent_a_byte_at_a_time_is_cut_before_it_completes(gw: ServeProcess) -> None:
    head = build("GET", "/health/live" + "?x=" + "a" * 100)  # would take 30 s at this pace
    with connect(gw) as s:
        sent, answer = trickle(s, head, within=HEAD_S + SLACK_S)
        assert answer == b"", (sent, answer)  # closed, no answer
        assert sent < len(head)
        assert live(gw).status_code == 200


def test_a_head_split_in_a_few_parts_within_the_timeout_is_answered(gw: ServeProcess) -> None:
    head = build("GET", "/health/live")
    with connect(gw) as s:
        for part in (head[:10], head[10:30], head[30:]):
            s.sendall(part)
            time.sleep(0.1)
        r = receive(s)
    assert r is not None and r.status == 200, r


def slow_body_request(gw: ServeProcess, length: int) -> bytes:
    headers = [*bearer(gw.tokens.operator).items(), ("Idempotency-Key", secrets.token_hex(8))]
    headers.append(("Content-Length", str(length)))
    return build("POST", "/api/v1/workflows", headers, body=None)


def test_a_body_sent_a_byte_at_a_time_is_cut_with_408(gw: ServeProcess) -> None:
    before = metric(gw, "awp_http_timeouts_total", 'phase="body"')
    body = b'{"id": "slow", "tasks": [' + b" " * 200 + b"]}"  # 40 s at this pace
    with connect(gw) as s:
        s.sendall(slow_body_request(gw, len(body)))
        sent, answer = trickle(s, body, within=BODY_S + SLACK_S, send_for=BODY_S - 1)
        assert answer, f"no answer after {sent} body bytes"
        assert sent < len(body)
        r = parse_response(answer)
        assert isinstance(r, RawResponse), answer[:300]
        error = check_envelope(r, 408, "request_timeout")
        assert "did not arrive within 2 s" in error["message"], error
        assert r.headers.get("x-content-type-options") == "nosniff"
    assert metric(gw, "awp_http_timeouts_total", 'phase="body"') == before + 1
    assert live(gw).status_code == 200


def test_a_body_that_comes_in_parts_within_the_timeout_is_read(gw: ServeProcess) -> None:
    body = b'{"id": "parts-' + secrets.token_hex(4).encode() + b'", "tasks": [{"key": "a", "executor": "mock"}]}'
    with connect(gw) as s:
        s.sendall(slow_body_request(gw, len(body)))
        for part in (body[:5], body[5:20], body[20:]):
            time.sleep(0.1)
            s.sendall(part)
        r = receive(s)
    assert r is not None and r.status in (200, 201), r


def test_a_kept_alive_connection_is_reused_then_closed_when_idle(gw: ServeProcess) -> None:
    request = build("GET", "/health/live").replace(b"Connection: close\r\n", b"")
    with connect(gw) as s:
        for i in range(2):  # the same connection answers twice
            time.sleep(0.3 * i)
            s.sendall(request)
            s.settimeout(SLACK_S)
            r = receive(s)
            assert r is not None and r.status == 200, r
            assert r.headers.get("x-content-type-options") == "nosniff"
        idle_since = time.monotonic()
        assert closed_by_server(s, KEEPALIVE_S + SLACK_S) == b""
        assert time.monotonic() - idle_since >= HEAD_S + 0.5  # the keep-alive timeout, not the head's


def test_a_next_head_trickled_on_a_kept_alive_connection_is_cut(gw: ServeProcess) -> None:
    """By the head timeout from its first byte (counted in the metric), not by the later keep-alive timeout."""
    before = metric(gw, "awp_http_timeouts_total", 'phase="head"')
    request = build("GET", "/health/live").replace(b"Connection: close\r\n", b"")
    with connect(gw) as s:
        s.sendall(request)
        s.settimeout(SLACK_S)
        r = receive(s)
        assert r is not None and r.status == 200, r
        head = build("GET", "/health/live?" + "b" * 200)
        sent, answer = trickle(s, head, within=KEEPALIVE_S + SLACK_S)
        assert answer == b"" and sent < len(head), (sent, answer)
    assert metric(gw, "awp_http_timeouts_total", 'phase="head"') == before + 1


def test_many_slow_clients_at_once_do_not_stop_normal_requests(gw: ServeProcess) -> None:
    """Idle, slow-head and slow-body connections together; normal requests on fresh connections go on meanwhile,
    and every slow one is closed."""
    results: list[bytes | None] = []

    def slow_head() -> None:
        with connect(gw) as s:
            results.append(trickle(s, build("GET", "/health/live?" + "c" * 300), within=HEAD_S + SLACK_S)[1])

    def slow_body() -> None:
        body = b"{" + b" " * 300 + b"}"
        with connect(gw) as s:
            s.sendall(slow_body_request(gw, len(body)))
            answer = trickle(s, body, within=BODY_S + SLACK_S, send_for=BODY_S - 1)[1]
            results.append(answer if answer is None else answer[:12])

    idle = [connect(gw) for _ in range(50)]
    threads = [threading.Thread(target=f) for f in [slow_head] * 10 + [slow_body] * 5]
    try:
        for t in threads:
            t.start()
        statuses = []
        while any(t.is_alive() for t in threads):
            statuses.append(live(gw).status_code)
            time.sleep(0.1)
        assert statuses and set(statuses) == {200}, statuses
        assert len(results) == 15, results
        assert results.count(b"") == 10, results  # the slow heads: closed without an answer
        assert results.count(b"HTTP/1.1 408") == 5, results  # the slow bodies: 408, then closed
        for s in idle:
            assert closed_by_server(s, SLACK_S) == b""
    finally:
        for t in threads:
            t.join(HEAD_S + BODY_S + 2 * SLACK_S)
        for s in idle:
            s.close()
    log = gw.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def test_the_timeouts_are_checked_at_start() -> None:
    command = [sys.executable, "-c", "import sys; from awp.cli.main import main; sys.exit(main())", "serve"]
    for option in ("--head-timeout-ms", "--body-timeout-ms", "--keepalive-timeout-ms"):
        r = subprocess.run([*command, option, "0"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and option in r.stderr, r.stderr
