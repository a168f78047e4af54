"""Hostile input never gives a 500 (a real ``awp serve``, raw bytes over a socket): bytes that are not UTF-8 in
``Authorization`` or ``Idempotency-Key``, numbers beyond a double, lone UTF-16 surrogates, JSON nested deeper
than 64 levels, and requests aiohttp's own parser refuses (control characters in headers, bad header names,
broken framing) each answer a 4xx with the error envelope and ``X-Request-Id``, on every kind of route (read,
write, register, worker); nothing stored is lost, and the gateway log has no traceback and no forged line."""

from __future__ import annotations

import gzip
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from raw_http import Header, build, check_envelope, exchange, parse_response

from awp.logsafe import SafeFormatter, escape_controls
from awp.protocol.jsonio import MAX_DEPTH
from awp_testing.gateway import PROTOCOL, ServeProcess, serve, wait_until


@dataclass
class Seeded:
    gw: ServeProcess
    run_id: str
    run_status: str
    worker_id: str
    session: str


@pytest.fixture(scope="module")
def seeded(db_dsn: str) -> Iterator[Seeded]:
    with serve(db_dsn) as gw:
        op = gw.auth("operator")
        wf = {"id": "h", "tasks": [{"key": "a", "executor": "mock"}]}
        httpx.post(gw.api("/workflows"), json=wf, headers={**op, "Idempotency-Key": "seed-wf"}).raise_for_status()
        run = httpx.post(gw.api("/workflows/h/versions/1/runs"), headers={**op, "Idempotency-Key": "seed-run"})
        run.raise_for_status()
        worker = httpx.post(
            gw.api("/workers/register"), json={"executor_kinds": ["mock"]}, headers=gw.auth("bootstrap")
        )
        worker.raise_for_status()
        w = worker.json()
        yield Seeded(gw, run.json()["run_id"], run.json()["status"], w["worker_id"], w["session_token"])


@dataclass(frozen=True)
class Route:
    kind: str  # read, write, register, worker
    method: str
    path: str  # {w}: the seeded worker's id
    body: bytes | None  # a valid body with @@ where any JSON value fits

    def target(self, s: Seeded) -> str:
        return self.path.replace("{w}", s.worker_id)

    def headers(self, s: Seeded, idempotency_key: str | bytes = "hostile") -> list[tuple[str, str | bytes]]:
        if self.kind == "read":
            return [("Authorization", f"Bearer {s.gw.tokens.viewer}")]
        if self.kind == "write":
            return [("Authorization", f"Bearer {s.gw.tokens.operator}"), ("Idempotency-Key", idempotency_key)]
        if self.kind == "register":
            return [("Authorization", f"Bearer {s.gw.tokens.bootstrap}")]
        return [("Authorization", f"Bearer {s.session}"), *PROTOCOL.items()]

    def with_value(self, fragment: bytes) -> bytes:
        assert self.body is not None
        return self.body.replace(b"@@", fragment)


RESULT = b'{"kind": "success", "output": {"v": @@}}'
ROUTES = {
    "read-runs": Route("read", "GET", "/api/v1/runs", None),
    "write-workflows": Route(
        "write",
        "POST",
        "/api/v1/workflows",
        b'{"id": "hx", "tasks": [{"key": "a", "executor": "mock", "input": {"v": @@}}]}',
    ),
    "write-runs": Route("write", "POST", "/api/v1/workflows/h/versions/1/runs", b'{"input": {"v": @@}}'),
    "register": Route(
        "register", "POST", "/api/v1/workers/register", b'{"executor_kinds": ["mock"], "display_name": @@}'
    ),
    "worker-claims": Route("worker", "POST", "/api/v1/workers/{w}/claims", b'{"slots": 1, "wait_ms": 0, "x": @@}'),
    "worker-heartbeat": Route("worker", "POST", "/api/v1/workers/{w}/heartbeat", b'{"leases": [], "x": @@}'),
    "worker-complete": Route(
        "worker",
        "POST",
        "/api/v1/workers/{w}/leases/d-none/complete",
        b'{"lease_token": "t", "result": ' + RESULT + b"}",
    ),
    "worker-completions": Route(
        "worker",
        "POST",
        "/api/v1/workers/{w}/completions",
        b'{"results": [{"dispatch_id": "d", "lease_token": "t", "result": ' + RESULT + b"}]}",
    ),
}
BODY_ROUTES = [name for name, route in ROUTES.items() if route.body is not None]

# Valid JSON that the strict reader refuses (python/awp/protocol/jsonio.py): the answer names the reader's rule.
REFUSED_VALUES = {
    "1e400": b"1e400",
    "minus-1e400": b"-1e400",
    "integer-of-400-digits": b"1" + b"0" * 400,
    "lone-high-surrogate": b'"\\ud800"',
    "lone-low-surrogate": b'"a\\udfffb"',
    "surrogate-in-a-key": b'{"\\udc00": 1}',
    "nul": b'"a\\u0000"',
    "nested-200-deep": b"[" * 200 + b"]" * 200,
    "nested-100000-deep": b"[" * 100_000 + b"]" * 100_000,
}


def send(s: Seeded, route: Route, body: bytes | None, headers: list[tuple[str, str | bytes]] | None = None) -> Any:
    return exchange(
        s.gw.port, build(route.method, route.target(s), route.headers(s) if headers is None else headers, body)
    )


@pytest.mark.parametrize("route", BODY_ROUTES)
@pytest.mark.parametrize("value", REFUSED_VALUES)
def test_json_the_strict_reader_refuses_is_a_400_on_every_route(seeded: Seeded, route: str, value: str) -> None:
    r = send(seeded, ROUTES[route], ROUTES[route].with_value(REFUSED_VALUES[value]))
    error = check_envelope(r, 400, "invalid_request")
    assert error["message"].startswith("the request body is refused: "), error


@pytest.mark.parametrize("route", BODY_ROUTES)
def test_a_surrogate_encoded_as_utf8_bytes_is_not_utf8(seeded: Seeded, route: str) -> None:
    r = send(seeded, ROUTES[route], ROUTES[route].with_value(b'"\xed\xa0\x80"'))  # U+D800 in WTF-8
    assert "not valid JSON" in check_envelope(r, 400, "invalid_request")["message"]


def test_nesting_up_to_the_maximum_depth_is_accepted(seeded: Seeded) -> None:
    # {"input": {"v": [[...]]}}: the body is level 1, input level 2, v level 3.
    route = ROUTES["write-runs"]
    inner = MAX_DEPTH - 2
    ok = send(seeded, route, route.with_value(b"[" * inner + b"]" * inner), route.headers(seeded, "deep-64"))
    assert ok is not None and ok.status == 202, ok
    too_deep = route.with_value(b"[" * (inner + 1) + b"]" * (inner + 1))
    r = send(seeded, route, too_deep, route.headers(seeded, "deep-65"))
    assert f"deeper than {MAX_DEPTH} levels" in check_envelope(r, 400, "invalid_request")["message"]


def test_numbers_within_a_double_are_accepted(seeded: Seeded) -> None:
    route = ROUTES["write-runs"]
    body = route.with_value(b"[1.7976931348623157e308, -1e308, 1e-400, " + b"9" * 300 + b"]")
    r = send(seeded, route, body, route.headers(seeded, "big-numbers"))
    assert r is not None and r.status == 202, r


@pytest.mark.parametrize("route", list(ROUTES))
def test_authorization_that_is_not_utf8_is_a_401(seeded: Seeded, route: str) -> None:
    spec = ROUTES[route]
    headers = [(k, v) for k, v in spec.headers(seeded) if k != "Authorization"]
    for value in (b"Bearer \xff\xfe", b"Bearer " + seeded.gw.tokens.operator.encode() + b"\xc3\x28", b"\xe2\x82"):
        r = send(seeded, spec, spec.with_value(b"1") if spec.body else None, [("Authorization", value), *headers])
        check_envelope(r, 401, "unauthorized")


@pytest.mark.parametrize("route", ["write-workflows", "write-runs"])
def test_an_idempotency_key_that_is_not_utf8_is_a_400(seeded: Seeded, route: str) -> None:
    spec = ROUTES[route]
    r = send(seeded, spec, spec.with_value(b"1"), spec.headers(seeded, b"key-\xff\xfe"))
    assert "Idempotency-Key" in check_envelope(r, 400, "invalid_request")["message"]


@pytest.mark.parametrize("route", [name for name, r in ROUTES.items() if r.kind == "worker"])
def test_a_protocol_header_that_is_not_utf8_is_refused(seeded: Seeded, route: str) -> None:
    spec = ROUTES[route]
    headers = [(k, v) for k, v in spec.headers(seeded) if k != "X-Worker-Protocol-Version"]
    r = send(seeded, spec, spec.with_value(b"1"), [*headers, ("X-Worker-Protocol-Version", b"\xff")])
    check_envelope(r, 400, "worker_protocol_unsupported")


def test_query_and_path_values_that_are_not_utf8_text(seeded: Seeded) -> None:
    read = seeded.gw.tokens.viewer
    auth = [("Authorization", f"Bearer {read}")]
    port = seeded.gw.port
    # A cursor is base64url of a JSON key: a lone surrogate in it is an invalid cursor.
    check_envelope(exchange(port, build("GET", "/api/v1/workflows?cursor=WyJcdWQ4MDAiXQ", auth)), 400)
    check_envelope(exchange(port, build("GET", "/api/v1/runs?workflow_id=a%00b", auth)), 400)
    # Percent-escapes that are not UTF-8 stay as they are (a run id that does not exist).
    check_envelope(exchange(port, build("GET", "/api/v1/runs/%ED%A0%80%ff", auth)), 404, "not_found")
    check_envelope(exchange(port, build("GET", "/api/v1/runs/x%0AERROR%20awp.forged:%20injected", auth)), 404)
    # Raw bytes that are not ASCII in the request target: refused by the HTTP parser.
    for target in (b"/api/v1/runs/run_\xff\xfe", b"/api/v1/runs?workflow_id=\xed\xa0\x80"):
        error = check_envelope(exchange(port, build("GET", target, auth)), 400, "invalid_request")
        assert error["message"].startswith("malformed HTTP request: "), error


# Requests aiohttp's HTTP parser refuses before any route runs.
PARSER_REFUSED = {
    "control-character-in-a-header-value": lambda t, h: build("GET", t, [*h, ("X-Foo", b"\x1b[31m")]),
    "del-in-a-header-value": lambda t, h: build("GET", t, [*h, ("X-Foo", b"a\x7fb")]),
    "non-token-header-name": lambda t, h: build("GET", t, [*h, (b"X\xffFoo", "1")]),
    "header-without-colon": lambda t, h: build("GET", t, [*h, (b"NoColonHere", b"")]).replace(
        b"NoColonHere: ", b"NoColonHere"
    ),
    "unknown-method": lambda t, h: build("FOO", t, h),
    "content-length-overflow": lambda t, h: build("POST", t, [*h, ("Content-Length", "9" * 30)], b"{}", False),
    "negative-content-length": lambda t, h: build("POST", t, [*h, ("Content-Length", "-1")], b"{}", False),
    "two-content-lengths": lambda t, h: build(
        "POST", t, [*h, ("Content-Length", "2"), ("Content-Length", "3")], b"{}", False
    ),
    "chunked-garbage": lambda t, h: build(
        "POST", t, [*h, ("Transfer-Encoding", "chunked")], b"zz\r\nabc\r\n0\r\n\r\n", False
    ),
    "control-character-in-the-path": lambda t, h: build("GET", t.encode() + b"\x01", h),
    "tls-hello": lambda t, h: b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,
}


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("case", PARSER_REFUSED)
def test_requests_the_http_parser_refuses_get_the_envelope(seeded: Seeded, route: str, case: str) -> None:
    spec = ROUTES[route]
    error = check_envelope(
        exchange(seeded.gw.port, PARSER_REFUSED[case](spec.target(seeded), spec.headers(seeded))), 400
    )
    assert error["code"] == "invalid_request" and error["message"].startswith("malformed HTTP request: "), error


def test_a_chunked_body_broken_after_the_headers_is_a_400(seeded: Seeded) -> None:
    """The headers arrive first (the route is running) and the chunked body breaks afterwards."""
    spec = ROUTES["write-runs"]
    head = build("POST", spec.target(seeded), [*spec.headers(seeded, "chunked-late"), ("Transfer-Encoding", "chunked")])
    with socket.create_connection(("127.0.0.1", seeded.gw.port), timeout=30) as s:
        s.sendall(head + b'5\r\n{"inp')
        time.sleep(0.2)
        s.sendall(b"\r\nzz\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    error = check_envelope(parse_response(data), 400, "invalid_request")
    assert "malformed" in error["message"], error


def test_a_gzip_body_that_does_not_decompress_is_a_400(seeded: Seeded) -> None:
    spec = ROUTES["write-runs"]
    body = gzip.compress(b'{"input": {}}')[:-6] + b"\x00garbage"
    headers = [*spec.headers(seeded, "gzip-bad"), ("Content-Encoding", "gzip")]
    error = check_envelope(exchange(seeded.gw.port, build("POST", spec.target(seeded), headers, body)), 400)
    assert error["message"].startswith("the request body is malformed"), error
    # Refused before the body is read (no token): aiohttp drains the broken body after the answer.
    no_auth = [("Content-Encoding", "gzip"), ("Idempotency-Key", "gzip-bad-2")]
    check_envelope(exchange(seeded.gw.port, build("POST", spec.target(seeded), no_auth, body)), 401)


def test_a_body_cut_short_by_the_client_is_no_server_error(seeded: Seeded) -> None:
    spec = ROUTES["write-runs"]
    line = "route=/api/v1/workflows/{workflow_id}/versions/{version}/runs status=400"

    def logged() -> int:
        return seeded.gw.log_path.read_text(errors="replace").count(line)

    before = logged()
    headers = [*spec.headers(seeded, "cut-short"), ("Content-Length", "1000")]
    data = build("POST", spec.target(seeded), headers, b'{"input": {', content_length=False)
    assert exchange(seeded.gw.port, data, timeout=10, half_close=True) is None  # the client hung up: no answer
    # The gateway logs the request once, as a 400 (and no traceback: the last test checks the whole log).
    wait_until(lambda: logged() > before, 10, what="the access log line of the cut request")


@pytest.mark.parametrize("expect", [b"100-continue", b"something-else", b"\xff\xfe", b"\xed\xa0\x80"])
def test_an_expect_header_is_no_error(seeded: Seeded, expect: bytes) -> None:
    """aiohttp answers an Expect other than 100-continue with a text/plain 417 (a 500 when it is not UTF-8):
    the gateway ignores it (RFC 9110 allows that)."""
    auth: list[Header] = [("Authorization", f"Bearer {seeded.gw.tokens.viewer}"), ("Expect", expect)]
    r = exchange(seeded.gw.port, build("GET", "/api/v1/runs", auth))
    assert r is not None and r.status == 200 and r.headers.get("x-request-id"), r
    check_envelope(exchange(seeded.gw.port, build("GET", "/api/v1/no-such-route", auth)), 404, "not_found")


def test_dashboard_forms_and_cookies_that_are_not_utf8_are_no_server_error(seeded: Seeded) -> None:
    port, viewer = seeded.gw.port, seeded.gw.tokens.viewer.encode()
    form = [("Content-Type", "application/x-www-form-urlencoded")]
    for body in (b"token=\xff\xfe", b"token=" + viewer + b"&next=\xed\xa0\x80"):
        r = exchange(port, build("POST", "/ui/login", form, body))
        assert r is not None and r.status == 400 and r.headers.get("x-request-id"), r
    broken = build("POST", "/ui/login", [("Content-Type", "multipart/form-data; boundary=x")], b"--x\r\ngarbage")
    r = exchange(port, broken)
    assert r is not None and r.status == 400, r
    # A next URL with CR LF (header injection) is not followed: the sign-in lands on the runs page.
    r = exchange(port, build("POST", "/ui/login", form, b"token=" + viewer + b"&next=%2Fui%2Fx%0D%0AX-Injected:%201"))
    assert r is not None and r.status == 303 and r.headers["location"] == "/ui/runs" and "x-injected" not in r.headers
    huge = build("POST", "/ui/login", [*form, ("Content-Length", "99999999999")], b"token=x", content_length=False)
    r = exchange(port, huge)
    assert r is not None and r.status == 413, r  # at once, not after waiting for the body
    for cookie in (b"awp_ui=viewer.1.\xff\xfe.x", b"awp_ui=\xed\xa0\x80"):
        r = exchange(port, build("GET", "/ui/runs", [("Cookie", cookie)]))
        assert r is not None and r.status == 303 and r.headers.get("x-request-id"), r  # to the sign-in form


def test_stored_data_is_intact_and_the_log_is_clean(seeded: Seeded) -> None:
    """Runs last in this module: after every hostile request above."""
    gw = seeded.gw
    run = httpx.get(gw.api(f"/runs/{seeded.run_id}"), headers=gw.auth("viewer"))
    assert run.status_code == 200 and run.json()["run_id"] == seeded.run_id
    assert httpx.get(gw.api("/workflows/h/versions/1"), headers=gw.auth("viewer")).status_code == 200
    assert httpx.get(gw.api(f"/workers/{seeded.worker_id}"), headers=gw.auth("viewer")).status_code == 200
    worker = httpx.post(gw.api("/workers/register"), json={"executor_kinds": ["mock"]}, headers=gw.auth("bootstrap"))
    assert worker.status_code == 201, worker.text
    w = worker.json()
    hb = httpx.post(
        gw.api(f"/workers/{w['worker_id']}/heartbeat"),
        json={},
        headers={"Authorization": f"Bearer {w['session_token']}", **PROTOCOL},
    )
    assert hb.status_code == 200, hb.text
    assert gw.health("/health/live") is not None
    log = gw.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    lines = log.splitlines()
    assert not [line for line in lines if line.startswith(("ERROR", "CRITICAL"))], log[-3000:]
    assert not [line for line in lines if "awp.forged" in line and not line.startswith("INFO awp.gateway.access")]
    # About ninety requests were refused by the parser above (each counted in /metrics); the WARNING about them
    # is rate-limited (at most one a minute).
    metrics = httpx.get(gw.url("/metrics")).text
    refused = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("awp_http_requests_total{") and 'route="malformed"' in line
    )
    warnings = [line for line in lines if line.startswith("WARNING awp.gateway.http")]
    if refused >= 50:  # the whole module ran
        assert 1 <= len(warnings) <= 3, (refused, warnings)


def test_log_lines_escape_control_characters() -> None:
    record = logging.LogRecord(
        "awp.gateway", logging.WARNING, __file__, 1, "path %s", ("/a\nERROR forged\x1b[31m\u2028",), None
    )
    line = SafeFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert line == "WARNING awp.gateway: path /a\\x0aERROR forged\\x1b[31m\\u2028"
    assert escape_controls("tab\there\r\n\udcff", keep_newlines=True) == "tab\\x09here\\x0d\n\\udcff"


def test_the_awp_command_logs_through_the_escaping_formatter() -> None:
    code = (
        "import logging\n"
        "from awp.cli.main import main\n"
        "try:\n    main(['db', '--help'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "logging.getLogger('awp.gateway').warning('request %s', '/x\\nERROR awp.forged: injected')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    lines = out.stderr.splitlines()
    assert lines == ["WARNING awp.gateway: request /x\\x0aERROR awp.forged: injected"], out.stderr
