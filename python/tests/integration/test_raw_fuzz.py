"""A raw-bytes fuzzer for what schemathesis never sends (test_gateway_fuzz.py sends well-formed HTTP): valid
requests to every kind of route (read, write, register, worker), mutated at random (seeded) in their headers,
framing and bodies, sent over a socket to a real ``awp serve``.

Oracle: never a 5xx; every answer is a 4xx with the error envelope and ``X-Request-Id`` or a success with
``X-Request-Id``; a connection may close without an answer only when the request itself was cut short; the
gateway stays live, keeps what it stored, and logs no traceback, no ERROR and no 5xx.

50 times ``AWP_FUZZ_EXAMPLES`` requests: 300 in ``make test`` (6, as test_gateway_fuzz.py), 10,000 in ``make fuzz``
(200). ``AWP_FUZZ_SEED`` picks another sequence; a failure names the seed and the request number to replay it.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import random
import socket
import time
from dataclasses import dataclass, field

import httpx
import pytest
from raw_http import RawResponse, build, check_envelope, exchange, receive

from awp_testing.gateway import PROTOCOL, ServeProcess

EXAMPLES = 50 * int(os.environ.get("AWP_FUZZ_EXAMPLES", "6"))  # raw requests
SEED = int(os.environ.get("AWP_FUZZ_SEED", "20261201"))


@dataclass
class Request:
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes | None
    content_length: bool = True
    mutations: list[str] = field(default_factory=list)
    may_close: bool = False  # cut short: the server may close without an answer
    split_at: int | None = None  # send in two packets (the route runs before the rest comes)
    half_close: bool = False
    raw_bytes: bytes | None = None  # the whole request, when a mutation wrote it byte by byte

    def raw(self) -> bytes:
        if self.raw_bytes is not None:
            return self.raw_bytes
        return build(self.method, self.target, self.headers, self.body, self.content_length)


@dataclass
class Target:
    worker_id: str = ""
    session: str = ""
    ui_cookie: bytes = b""  # a signed-in dashboard session (its answers are HTML)


SLOT = b"@@"  # where any JSON value fits in a template body
VALUES = [b"1", b'"text"', b"null", b"[1, 2]", b'{"k": "v"}', b"true", b"-0.5e-3"]


def templates(gw: ServeProcess, t: Target, rng: random.Random) -> list[Request]:
    def auth(token: str) -> tuple[bytes, bytes]:
        return (b"Authorization", f"Bearer {token}".encode())

    key = (b"Idempotency-Key", f"fuzz-{rng.randrange(10**9)}".encode())
    json = (b"Content-Type", b"application/json")
    worker = [auth(t.session), *((k.encode(), v.encode()) for k, v in PROTOCOL.items()), json]
    w = t.worker_id.encode()
    result = b'{"kind": "success", "output": {"v": @@}}'
    return [
        Request(b"GET", b"/api/v1/runs?limit=2", [auth(gw.tokens.viewer)], None),
        Request(b"GET", b"/api/v1/workflows/fz/versions/1", [auth(gw.tokens.operator)], None),
        Request(b"GET", b"/health/live", [], None),
        Request(
            b"POST",
            b"/api/v1/workflows",
            [auth(gw.tokens.operator), key, json],
            b'{"id": "fz", "tasks": [{"key": "a", "executor": "mock", "input": {"v": @@}}]}',
        ),
        Request(
            b"POST",
            b"/api/v1/workflows/fz/versions/1/runs",
            [auth(gw.tokens.operator), key, json],
            b'{"input": {"v": @@}}',
        ),
        Request(
            b"POST",
            b"/api/v1/workers/register",
            [auth(gw.tokens.bootstrap), json],
            b'{"executor_kinds": ["python"], "display_name": "fz", "x": @@}',
        ),
        Request(b"POST", b"/api/v1/workers/" + w + b"/claims", worker, b'{"slots": 1, "wait_ms": 0, "x": @@}'),
        Request(b"POST", b"/api/v1/workers/" + w + b"/heartbeat", worker, b'{"leases": [], "x": @@}'),
        Request(
            b"POST",
            b"/api/v1/workers/" + w + b"/leases/d-fuzz/complete",
            worker,
            b'{"lease_token": "t", "result": ' + result + b"}",
        ),
        Request(
            b"POST",
            b"/api/v1/workers/" + w + b"/completions",
            worker,
            b'{"results": [{"dispatch_id": "d", "lease_token": "t", "result": ' + result + b"}]}",
        ),
        Request(b"GET", b"/ui/runs?status=running&page=1", [(b"Cookie", t.ui_cookie)], None),
        Request(
            b"POST",
            b"/ui/login",
            [(b"Content-Type", b"application/x-www-form-urlencoded")],
            b"token=" + gw.tokens.viewer.encode() + b"&next=%2Fui%2Fruns",
        ),
    ]


BAD_BYTES = [
    b"\x00",
    b"\x01",
    b"\x1b[31m",
    b"\r",
    b"\n",
    b"\r\nX-Injected: 1",
    b"\x7f",
    b"\x80",
    b"\xff",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xe2\x80\xa8",
    b"\xef\xbb\xbf",
    b"\t",
    b" ",
    b'"',
    b"%0A",
    b"%00",
    b"%ff",
]
HEADER_NAMES = [b"Authorization", b"Idempotency-Key", b"X-Worker-Protocol-Version", b"X-Request-Id", b"Content-Type"]


def _insert(data: bytes, rng: random.Random, piece: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + piece + data[at:]


def _deep(rng: random.Random) -> bytes:
    depth = rng.choice([40, 62, 63, 64, 65, 100, 500, 999, 1000, 1001, 5000, 100_000])
    if rng.random() < 0.5:
        return b"[" * depth + b"]" * depth
    return b'{"a": ' * depth + b"0" + b"}" * depth


def _number(rng: random.Random) -> bytes:
    return rng.choice(
        [
            b"1e400",
            b"-1e400",
            b"1e309",
            b"1.7976931348623157e308",
            b"1.7976931348623159e308",
            b"1e-400",
            b"-0",
            b"1" + b"0" * rng.choice([18, 19, 20, 308, 309, 310, 400, 4300, 5000]),
            b"-" + b"9" * 330,
            b"0." + b"0" * 500 + b"1",
            b"1E+99999999999999999999",
            b"NaN",
            b"Infinity",
            b"01",
            b"1.",
            b".5",
            b"0x10",
        ]
    )


def _string(rng: random.Random) -> bytes:
    return rng.choice(
        [
            b'"\\ud800"',
            b'"\\udfff"',
            b'"a\\udc00b"',
            b'"\\ude00\\ud83d"',
            b'"\\ud83d\\ude00"',
            b'"\\u0000"',
            b'"\\u001b[31m"',
            b'"\xed\xa0\x80"',
            b'"\xff"',
            b'"\xc0\xaf"',
            b'"' + b"x" * 70_000 + b'"',
            b'"\\uZZZZ"',
            b'"\\',
            b'{"\\ud800": 1}',
            b'{"a": 1, "a": 2}',
            b'{"\\u0000": 1}',
        ]
    )


def _mutate_body(req: Request, rng: random.Random) -> None:
    body = req.body or b"{}"
    kind = rng.choice(["deep", "number", "string", "bad-bytes", "truncate-json", "garbage", "empty"])
    req.mutations.append("body:" + kind)
    if kind == "deep":
        value = _deep(rng)
    elif kind == "number":
        value = _number(rng)
    elif kind == "string":
        value = _string(rng)
    else:
        value = rng.choice(VALUES)
    body = body.replace(SLOT, value)
    if kind == "bad-bytes":
        body = _insert(body, rng, rng.choice(BAD_BYTES))
    elif kind == "truncate-json":
        body = body[: rng.randrange(len(body))]
    elif kind == "garbage":
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    elif kind == "empty":
        body = b""
    req.body = body


def _mutate_header(req: Request, rng: random.Random) -> None:
    kind = rng.choice(["value", "name", "duplicate", "drop", "new", "long"])
    req.mutations.append("header:" + kind)
    if kind == "value" and req.headers:
        i = rng.randrange(len(req.headers))
        name, value = req.headers[i]
        req.headers[i] = (name, _insert(value, rng, rng.choice(BAD_BYTES)))
    elif kind == "name" and req.headers:
        i = rng.randrange(len(req.headers))
        name, value = req.headers[i]
        req.headers[i] = (_insert(name, rng, rng.choice([*BAD_BYTES, b":", b" ", b"("])), value)
    elif kind == "duplicate" and req.headers:
        name, value = rng.choice(req.headers)
        req.headers.append((name, value + rng.choice([b"", b"x", b"\xff"])))
    elif kind == "drop" and req.headers:
        req.headers.pop(rng.randrange(len(req.headers)))
    elif kind == "new":
        req.headers.append(
            (rng.choice([*HEADER_NAMES, b"X-Fuzz", b"Expect", b"Connection"]), rng.choice(BAD_BYTES) * 3)
        )
    else:
        req.headers.append((b"X-Long", b"a" * rng.choice([100, 8000, 8191, 9000, 70_000])))


def _mutate_framing(req: Request, rng: random.Random) -> None:
    body = (req.body or b"{}").replace(SLOT, rng.choice(VALUES))
    kind = rng.choice(
        [
            "huge-length",
            "bad-length",
            "two-lengths",
            "chunked-bad",
            "chunked-late",
            "gzip-bad",
            "gzip-bomb",
            "truncated",
        ]
    )
    req.mutations.append("framing:" + kind)
    req.body = body
    if kind == "huge-length":
        req.content_length = False
        req.headers.append((b"Content-Length", rng.choice([b"99999999999", b"18446744073709551616", b"9" * 40])))
    elif kind == "bad-length":
        req.content_length = False
        req.headers.append((b"Content-Length", rng.choice([b"-1", b"0x10", b"1 2", b"+5", b"", b"\xff"])))
    elif kind == "two-lengths":
        req.content_length = False
        req.headers += [(b"Content-Length", str(len(body)).encode()), (b"Content-Length", str(len(body) + 1).encode())]
    elif kind in ("chunked-bad", "chunked-late"):
        req.content_length = False
        req.headers.append((b"Transfer-Encoding", rng.choice([b"chunked", b"chunked, chunked", b"gzip, chunked"])))
        half = len(body) // 2
        good = b"%x\r\n" % half + body[:half] + b"\r\n"
        broken = rng.choice(
            [b"zz\r\n", b"-1\r\n", b"ffffffffffffffffff\r\n", b"1;\xff\r\nx\r\n", b"3\r\nabcdef\r\n", b"\r\n\r\n"]
        )
        req.body = good + broken + b"0\r\n\r\n"
        if kind == "chunked-late":
            req.split_at = len(req.raw()) - len(req.body) + len(good)
    elif kind == "gzip-bad":
        req.headers.append((b"Content-Encoding", b"gzip"))
        req.body = gzip.compress(body)[:-6] + b"\x00garbage"
    elif kind == "gzip-bomb":
        req.headers.append((b"Content-Encoding", b"gzip"))
        req.body = gzip.compress(b" " * (20 * 1024 * 1024))  # 20 MiB of blanks in ~20 KiB: over every body limit
    else:  # truncated: Content-Length says more than comes, then the client hangs up
        req.body = body
        req.content_length = False
        req.headers.append((b"Content-Length", str(len(body) + rng.randrange(1, 1000)).encode()))
        req.may_close = True
        req.half_close = True


def _mutate_line(req: Request, rng: random.Random) -> None:
    kind = rng.choice(["method", "target", "long-target", "version", "flip"])
    req.mutations.append("line:" + kind)
    if kind == "method":
        req.method = rng.choice([b"FOO", b"get", b"G\xffT", b"", b"PO ST", b"DELETE", b"PATCH", b"OPTIONS", b"HEAD"])
    elif kind == "target":
        req.target = _insert(req.target, rng, rng.choice([*BAD_BYTES, b"/..", b"//", b"?", b"#", b"%", b"%zz"]))
    elif kind == "long-target":
        req.target += b"?x=" + b"a" * rng.choice([8000, 9000, 70_000])
    elif kind == "version":
        raw = req.raw()
        version = rng.choice([b"HTTP/9.9", b"HTTP/1.1 extra", b"HTTP/0.9", b"", b"HTTP/1.1\x00", b"HTTPS/1.1"])
        req.raw_bytes = raw.replace(b" HTTP/1.1\r\n", b" " + version + b"\r\n", 1)
    else:  # flip bytes in the request line and headers
        flipped = bytearray(req.raw())
        end = flipped.find(b"\r\n\r\n")
        for _ in range(rng.randrange(1, 4)):
            flipped[rng.randrange(end)] = rng.randrange(256)
        req.raw_bytes = bytes(flipped)
        req.may_close = True  # a flipped Content-Length may wait for a body that never comes


ORDER = [_mutate_body, _mutate_header, _mutate_framing, _mutate_line]  # framing sees the final body


def mutate(req: Request, rng: random.Random) -> Request:
    chosen = [rng.choice([_mutate_body, _mutate_body, _mutate_header, _mutate_framing, _mutate_line])]
    chosen += rng.sample(ORDER, rng.choice([0, 0, 1, 2]))
    for step in sorted(set(chosen), key=ORDER.index):
        step(req, rng)
    if req.body is not None and SLOT in req.body:
        req.body = req.body.replace(SLOT, rng.choice(VALUES))
    return req


def send(port: int, req: Request) -> RawResponse | None:
    raw = req.raw()
    timeout = 3.0 if req.may_close else 20.0
    if req.split_at is None:
        return exchange(port, raw, timeout=timeout, half_close=req.half_close)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw[: req.split_at])
        time.sleep(0.05)
        with contextlib.suppress(OSError):
            s.sendall(raw[req.split_at :])
        return receive(s)


# The fuzzed worker stays online for the whole run.
GATEWAY_SETTINGS = {"lease_duration_ms": 3600000, "heartbeat_interval_ms": 600000}


@pytest.fixture(scope="module")
def fuzz_gw(gw: ServeProcess) -> ServeProcess:
    """The module's gateway (conftest.py) with workflow ``fz``."""
    op = gw.auth("operator")
    wf = {"id": "fz", "tasks": [{"key": "a", "executor": "mock"}]}
    httpx.post(gw.api("/workflows"), json=wf, headers={**op, "Idempotency-Key": "fz-seed"}).raise_for_status()
    return gw


def new_worker(gw: ServeProcess) -> Target:
    r = httpx.post(gw.api("/workers/register"), json={"executor_kinds": ["python"]}, headers=gw.auth("bootstrap"))
    r.raise_for_status()
    signed_in = httpx.post(gw.url("/ui/login"), data={"token": gw.tokens.viewer})
    assert signed_in.status_code == 303 and signed_in.cookies, signed_in
    cookie = "; ".join(f"{name}={value}" for name, value in signed_in.cookies.items())
    return Target(r.json()["worker_id"], r.json()["session_token"], cookie.encode())


def check(req: Request, r: RawResponse | None, where: str) -> str:
    """The oracle for one answer; returns its class for the summary."""
    if r is None:
        assert req.may_close, f"no answer to a complete request: {where}"
        return "closed"
    assert r.status < 500, f"{r.status} {r.body[:300]!r}: {where}"
    assert r.headers.get("x-request-id"), f"no X-Request-Id: {where}"
    if r.status >= 400 and req.raw().startswith(b"HEAD ") and r.body == b"":
        return f"{r.status} HEAD"  # an answer to a HEAD request that was parsed has headers only
    if r.status >= 400 and r.headers.get("content-type", "").startswith("text/html"):
        assert req.raw().split(b" ", 2)[1].startswith(b"/ui"), where  # only the dashboard answers HTML
        return f"{r.status} html"
    if r.status >= 400:
        try:
            error = check_envelope(r)
        except AssertionError as e:
            raise AssertionError(f"{e}: {where}") from None
        return f"{r.status} {error['code']}"
    return str(r.status)


def test_random_raw_requests_never_get_a_5xx(fuzz_gw: ServeProcess) -> None:
    gw = fuzz_gw
    rng = random.Random(SEED)
    seen: dict[str, int] = {}
    run = httpx.post(
        gw.api("/workflows/fz/versions/1/runs"), headers={**gw.auth("operator"), "Idempotency-Key": "fz-run"}
    )
    run_id = run.json()["run_id"]
    target = new_worker(gw)
    started = time.monotonic()
    for i in range(EXAMPLES):
        if i % 100 == 99:
            target = new_worker(gw)  # a session the fuzz may have drained stays usable
        base = rng.choice(templates(gw, target, rng))
        req = mutate(base, rng)
        r = send(gw.port, req)
        label = check(req, r, f"seed {SEED} request #{i} {req.mutations} {req.raw()[:400]!r}")
        seen[label] = seen.get(label, 0) + 1
    elapsed = time.monotonic() - started
    print(
        f"\n{EXAMPLES} raw requests in {elapsed:.1f} s (seed {SEED}): "
        + ", ".join(f"{k}: {v}" for k, v in sorted(seen.items()))
    )
    assert len(seen) >= 4, seen  # the mutations reached several different answers

    live = gw.health("/health/live")
    assert live is not None and live.status_code == 200
    assert httpx.get(gw.api(f"/runs/{run_id}"), headers=gw.auth("viewer")).status_code == 200
    again = httpx.post(
        gw.api("/workflows/fz/versions/1/runs"), headers={**gw.auth("operator"), "Idempotency-Key": "fz-run"}
    )
    assert again.status_code == 202 and again.json()["run_id"] == run_id  # the idempotency key still holds
    log = gw.log_path.read_text(errors="replace")
    at = log.find("Traceback")
    assert at < 0, "\n" + log[max(0, at - 500) : at + 3000]
    lines = log.splitlines()
    assert not [line for line in lines if line.startswith(("ERROR", "CRITICAL"))], log[-4000:]
    assert not [line for line in lines if " status=5" in line], [line for line in lines if " status=5" in line][:5]
    assert not [line for line in lines if line.startswith("X-Injected")]
