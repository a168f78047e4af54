"""Repeated failed authentication is answered late, per source (issue 44: 2,500 wrong tokens in 1.1 s were
answered at full speed): a real ``awp serve`` with the default back-off (2 s at most), clients bound to different
loopback addresses (127.0.0.N) as different sources; and :class:`awp.server.authfail.AuthFailures` on its own.

Timings are lower bounds (an answer held back by ``asyncio.sleep`` cannot come early) or comparisons between two
requests of the same run, never a fixed upper bound.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from awp.server.authfail import (
    FIRST_DELAY_S,
    FREE_FAILURES,
    MAX_SOURCES,
    REPORT_EVERY_S,
    WINDOW_S,
    AuthFailures,
    source_of,
)
from awp_testing.gateway import PROTOCOL, ServeProcess, bearer

MAX_DELAY_S = 2.0
RUNS = "/api/v1/runs"


GATEWAY_OPTIONS = {"env": {"AWP_AUTH_BACKOFF_MAX_MS": str(int(MAX_DELAY_S * 1000))}}


def client(gw: ServeProcess, source: str) -> httpx.Client:
    """A client whose connections come from ``source`` (any 127.0.0.0/8 address reaches the gateway)."""
    return httpx.Client(base_url=gw.base_url, transport=httpx.HTTPTransport(local_address=source), timeout=30)


def wrong() -> dict[str, str]:
    return bearer("wrong-" + secrets.token_urlsafe(32))


def auth_failures(gw: ServeProcess) -> dict[str, float]:
    text = httpx.get(gw.url("/metrics"), timeout=10).text
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "awp_auth_failures_total"
    }


def timed(c: httpx.Client, path: str, headers: dict[str, str]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    r = c.get(path, headers=headers)
    return r, time.monotonic() - started


def assert_unauthorized(r: httpx.Response, code: str = "unauthorized") -> None:
    assert r.status_code == 401, (r.status_code, r.text)
    assert r.json()["error"]["code"] == code, r.text
    assert r.headers["X-Content-Type-Options"] == "nosniff"


def test_wrong_tokens_from_one_source_are_answered_ever_later_up_to_the_cap(gw: ServeProcess) -> None:
    before = auth_failures(gw)
    with client(gw, "127.0.0.2") as c:
        durations = []
        for _ in range(FREE_FAILURES + 5):
            r, took = timed(c, RUNS, wrong())
            assert_unauthorized(r)
            durations.append(took)
    # The first ones at once; then 0.25, 0.5, 1, 2, 2 s (the cap).
    expected = [FIRST_DELAY_S * 2**i for i in range(4)] + [MAX_DELAY_S]
    for took, delay in zip(durations[FREE_FAILURES:], expected, strict=True):
        assert took >= delay - 0.05, (durations, expected)
    assert max(durations[:FREE_FAILURES]) < durations[-1], durations
    after = auth_failures(gw)
    assert after["invalid"] == before["invalid"] + FREE_FAILURES + 5, (before, after)
    assert after["missing"] == before["missing"] and after["worker_session"] == before["worker_session"]


def test_a_correct_token_from_a_failing_source_is_not_held_back(gw: ServeProcess) -> None:
    with client(gw, "127.0.0.3") as c:
        for _ in range(FREE_FAILURES + 4):
            assert_unauthorized(c.get(RUNS, headers=wrong()))
        ok, ok_took = timed(c, RUNS, gw.auth("viewer"))
        assert ok.status_code == 200, ok.text
        assert ok.headers["X-Content-Type-Options"] == "nosniff"
        failed, failed_took = timed(c, RUNS, wrong())  # the success did not reset the source's count
        assert_unauthorized(failed)
        assert failed_took >= MAX_DELAY_S - 0.05
        assert ok_took < failed_took, (ok_took, failed_took)


def test_other_sources_are_not_held_back(gw: ServeProcess) -> None:
    with client(gw, "127.0.0.4") as slowed, client(gw, "127.0.0.5") as other:
        for _ in range(FREE_FAILURES + 4):
            assert_unauthorized(slowed.get(RUNS, headers=wrong()))
        r, held_back = timed(slowed, RUNS, wrong())
        assert_unauthorized(r)
        others = []
        for _ in range(FREE_FAILURES):
            r, took = timed(other, RUNS, wrong())
            assert_unauthorized(r)
            others.append(took)
    assert held_back >= MAX_DELAY_S - 0.05
    assert sum(others) < held_back, (others, held_back)


def test_held_back_answers_do_not_block_the_gateway(gw: ServeProcess) -> None:
    """Four held-back failures at once wait together (not one after the other), and a health check from another
    source is answered before them."""
    with client(gw, "127.0.0.6") as c:
        for _ in range(FREE_FAILURES + 4):
            assert_unauthorized(c.get(RUNS, headers=wrong()))
    results: list[tuple[int, float]] = []

    def fail_once() -> None:
        with client(gw, "127.0.0.6") as c:
            r, took = timed(c, RUNS, wrong())
            results.append((r.status_code, took))

    threads = [threading.Thread(target=fail_once) for _ in range(4)]
    started = time.monotonic()
    for t in threads:
        t.start()
    with client(gw, "127.0.0.7") as other:
        health = other.get("/health/live")
        health_done = time.monotonic()
    for t in threads:
        t.join(60)
    all_done = time.monotonic()
    assert health.status_code == 200
    assert [status for status, _ in results] == [401] * 4, results
    assert all(took >= MAX_DELAY_S - 0.05 for _, took in results), results
    assert health_done < all_done - 1.0  # it did not wait for them
    assert all_done - started < 4 * MAX_DELAY_S - 0.5, results  # concurrent, not serialized


def test_bad_credentials_are_401_never_5xx_and_counted_by_reason(gw: ServeProcess) -> None:
    before = auth_failures(gw)
    worker = "/api/v1/workers/wkr_" + secrets.token_hex(16)
    cases: list[tuple[str, str, Any, str]] = [
        ("GET", RUNS, {}, "missing"),
        ("GET", RUNS, {"Authorization": "Basic dXNlcjpwYXNz"}, "missing"),
        ("GET", RUNS, {"Authorization": "Bearer"}, "missing"),
        ("GET", RUNS, {"Authorization": b"Bearer \xff\xfe"}, "missing"),
        ("GET", RUNS, {"Authorization": "Bearer " + "x" * 6000}, "invalid"),
        ("POST", "/api/v1/workflows", {"Authorization": "Bearer " + gw.tokens.bootstrap}, "invalid"),
        ("POST", "/api/v1/workers/register", wrong(), "invalid"),
        ("POST", worker + "/heartbeat", {**wrong(), **PROTOCOL}, "worker_session"),
        ("POST", worker + "/claims", {**wrong(), **PROTOCOL}, "worker_session"),
    ]
    expected = {"missing": 0, "invalid": 0, "worker_session": 0}
    for i, (method, path, headers, reason) in enumerate(cases):
        with client(gw, f"127.0.1.{i + 1}") as c:  # a source each: none is held back
            r = c.request(method, path, headers=headers, content=b"{}" if method == "POST" else None)
        assert_unauthorized(r, "worker_session_invalid" if reason == "worker_session" else "unauthorized")
        expected[reason] += 1
    after = auth_failures(gw)
    assert {k: after[k] - before[k] for k in expected} == expected, (before, after)
    assert httpx.get(gw.url("/health/live"), timeout=10).status_code == 200


def test_the_log_reports_a_flood_in_one_line(gw: ServeProcess) -> None:
    """Dozens of failures from several sources cost one WARNING: the first failure, logged at once; the rest are
    summed up at the end of the minute."""
    for i in range(5):
        with client(gw, f"127.0.2.{i + 1}") as c:
            for _ in range(FREE_FAILURES):
                assert_unauthorized(c.get(RUNS, headers=wrong()))
    assert sum(auth_failures(gw).values()) >= 5 * FREE_FAILURES
    log = gw.log_path.read_text(errors="replace")
    lines = [line for line in log.splitlines() if "failed authentication" in line]
    assert 1 <= len(lines) <= 2, lines  # a second one when the module took over a minute
    assert lines[0].startswith("WARNING awp.gateway.auth: 1 failed authentication(s) from 1 source(s)"), lines
    assert "Traceback" not in log, log[-3000:]


async def test_the_back_off_table(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    failures = AuthFailures(max_delay_s=MAX_DELAY_S, clock=lambda: now[0])
    delays = [failures.failed("10.0.0.1", "invalid", "GET /x") for _ in range(FREE_FAILURES + 6)]
    assert delays == [0.0] * FREE_FAILURES + [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert failures.failed("10.0.0.2", "invalid", "GET /x") == 0.0  # another source
    now[0] += max(WINDOW_S, REPORT_EVERY_S)  # a new window: free again (and the log's period is over)
    assert failures.failed("10.0.0.1", "invalid", "GET /x") == 0.0
    off = AuthFailures(max_delay_s=0)
    assert [off.failed("10.0.0.1", "invalid", "GET /x") for _ in range(20)] == [0.0] * 20
    for i in range(MAX_SOURCES + 50):  # the table stays bounded: the least recent sources go
        failures.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", "invalid", "GET /x")
    assert len(failures._sources) == MAX_SOURCES
    assert failures.total == FREE_FAILURES + 6 + 2 + MAX_SOURCES + 50
    # Logged: the first failure at once, the next ones (two sources) when the clock passed the minute, the first
    # of ``off``; the last 10,050 wait for the end of the minute.
    reports = [r.getMessage() for r in caplog.records if r.name == "awp.gateway.auth" and r.levelname == "WARNING"]
    assert [m.split(" since")[0] for m in reports] == [
        "1 failed authentication(s) from 1 source(s)",
        f"{FREE_FAILURES + 7} failed authentication(s) from 2 source(s)",
        "1 failed authentication(s) from 1 source(s)",
    ], reports


async def test_a_flood_is_summed_up_at_the_end_of_the_period(caplog: pytest.LogCaptureFixture) -> None:
    failures = AuthFailures(report_every_s=0.2)
    for i in range(50):
        failures.failed(f"10.0.1.{i % 5}", "invalid", "GET /x")
    await asyncio.sleep(0.6)  # the summary's timer is due first
    reports = [r.getMessage() for r in caplog.records if r.name == "awp.gateway.auth" and r.levelname == "WARNING"]
    assert [m.split(" since")[0] for m in reports] == [
        "1 failed authentication(s) from 1 source(s)",
        "49 failed authentication(s) from 5 source(s)",
    ], reports


def test_sources_are_addresses_and_ipv6_by_its_64() -> None:
    assert source_of("192.0.2.7") == "192.0.2.7"
    assert source_of("2001:db8:1:2:aaaa::1") == source_of("2001:db8:1:2:bbbb::2") == "2001:db8:1:2::/64"
    assert source_of("2001:db8:1:3::1") != source_of("2001:db8:1:2::1")
    assert source_of("::ffff:192.0.2.7") == "192.0.2.7"
    assert source_of(None) == "-"
    assert source_of("not an address\n") == "not an address\\x0a"
