"""Results the server refuses and handlers that hang never make a worker loop or a black hole (AWP issue 13),
with a real gateway, real PostgreSQL and real ``awp worker`` processes.

- An output is measured as the database measures it (jsonb text): one right at the limit succeeds, one byte
  over fails at once as ``output_too_large`` (its compact JSON is a third smaller: measured that way it passed,
  was refused by the server and retried until its lease expired, on every attempt).
- A result the server still refuses (here: a server whose output limit is lower than the worker's) is reported
  once as ``permanent_failure`` ``result_rejected`` with the server's message: the task fails after one attempt,
  without waiting for its lease to expire. Single and batched completions.
- A sync handler that does not return keeps its slot; a worker whose every slot hangs claims nothing, says so
  once, and exits 4 at the end of its drain deadline.

Lease 10 s (a loop would show as an attempt ending after it), heartbeat 500 ms, safety margin 300 ms.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from worker_support import Workers, api, apply, mock_task, start_run, task, wait_run, wait_task_status

from awp.protocol.results import MAX_OUTPUT_BYTES
from awp_testing.gateway import ServeProcess, wait_until

pytestmark = pytest.mark.slow  # real processes

TEST_HANDLERS = "python/tests/handlers_for_tests.py"
LEASE_MS = 10_000


GATEWAY_SETTINGS = {"lease_duration_ms": LEASE_MS, "heartbeat_interval_ms": 500, "offline_after_heartbeats": 10}


def python_task(key: str, action: str, input: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "key": key,
        "executor": "python",
        "action": action,
        "input": input,
        "retry": {"max_attempts": 3, "interval_ms": 0},
        **extra,
    }


def seconds_between(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def attempts(dsn: str, run_id: str) -> list[tuple[str, int, str]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(
            "SELECT task_key, attempt, status FROM awp.attempts WHERE run_id = %s ORDER BY task_key, attempt", (run_id,)
        ).fetchall()


def pending_dispatches(dsn: str, run_id: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM awp.dispatches WHERE run_id = %s AND status = 'pending'", (run_id,))
        return int(row.fetchone()[0])  # type: ignore[index]  # count(*) returns one row


def stop(w: Any, expected: int) -> None:
    w.signal(signal.SIGTERM)
    assert w.wait_exit(20) == expected


def test_an_output_is_measured_the_database_way(gw: ServeProcess) -> None:
    with Workers(gw) as ws:
        w = ws.start("sized", executors="python", extra=["--handlers", TEST_HANDLERS])
        definition = {
            "id": "wr-sized",
            "tasks": [
                python_task("at", "test-sized-output", {"size": MAX_OUTPUT_BYTES}),
                python_task("over", "test-sized-output", {"size": MAX_OUTPUT_BYTES + 1}),
            ],
        }
        run_id = start_run(gw, apply(gw, definition))
        assert wait_run(gw, run_id, timeout=30)["status"] == "failed"
        at = task(gw, run_id, "at")["attempt_history"]
        assert [a["status"] for a in at] == ["succeeded"]
        assert len(json.dumps(at[0]["output"], separators=(", ", ": "))) == MAX_OUTPUT_BYTES
        over = task(gw, run_id, "over")["attempt_history"]
        assert [(a["status"], a["error_code"]) for a in over] == [("failed", "output_too_large")]
        assert f"{MAX_OUTPUT_BYTES + 1} bytes" in over[0]["error_message"]
        assert seconds_between(over[0]["started_at"], over[0]["finished_at"]) < LEASE_MS / 2000
        assert "refused" not in w.log()  # the server never had to refuse anything
        stop(w, 0)


@pytest.fixture
def lowered_output_limit(db_dsn: str) -> Iterator[int]:
    """The server's output limit lowered to 1000 bytes (a server and a worker that disagree, e.g. versions
    apart): what the worker's check lets through, the database refuses with 400 invalid_request."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        # The limit is one constant (db/functions/00_limits.sql) that every check calls; replacing it
        # invalidates the plans that folded it in.
        row = c.execute("SELECT pg_get_functiondef('awp._limit_output_bytes()'::regprocedure)").fetchone()
        assert row is not None
        original: str = row[0]
        lowered = original.replace("SELECT 65536", "SELECT 1000")
        assert lowered != original
        c.execute(lowered)
        try:
            yield 1000
        finally:
            c.execute(original)


@pytest.mark.parametrize("concurrency", [1, 2], ids=["single", "batched"])
def test_a_result_the_server_refuses_is_reported_once_as_result_rejected(
    gw: ServeProcess, lowered_output_limit: int, concurrency: int
) -> None:
    with Workers(gw) as ws:
        w = ws.start(
            f"refused-{concurrency}", executors="python", concurrency=concurrency, extra=["--handlers", TEST_HANDLERS]
        )
        definition = {
            "id": f"wr-refused-{concurrency}",
            "tasks": [
                python_task("big", "test-sized-output", {"size": 2000}),
                python_task("small", "test-sized-output", {"size": 500}),
            ],
        }
        run_id = start_run(gw, apply(gw, definition))
        assert wait_run(gw, run_id, timeout=30)["status"] == "failed"
        big = task(gw, run_id, "big")["attempt_history"]
        assert [(a["status"], a["error_code"]) for a in big] == [("failed", "result_rejected")]  # 1 of 3 attempts
        message = big[0]["error_message"]
        assert message.startswith("the server refused the result: 400 invalid_request: result output too large")
        assert "output is 2000 bytes, over the 1000-byte limit" in message
        # Settled by the worker's report, not by a lease expiry (10 s).
        assert seconds_between(big[0]["started_at"], big[0]["finished_at"]) < LEASE_MS / 2000
        assert [a["status"] for a in task(gw, run_id, "small")["attempt_history"]] == ["succeeded"]
        assert w.log().count("reporting a permanent failure result_rejected") == 1
        assert "refused result_rejected too" not in w.log()
        stop(w, 0)
        assert "1 refused by the server and reported as result_rejected" in w.log()


def test_hung_sync_handlers_keep_their_slots_and_the_worker_stops_claiming(gw: ServeProcess, db_dsn: str) -> None:
    with Workers(gw) as ws:
        w = ws.start("hung", executors="python", concurrency=2, shutdown_timeout=3, extra=["--handlers", TEST_HANDLERS])
        hang = {"executor": "python", "action": "test-hang", "input": {}, "timeout_ms": 1500}
        definition = {"id": "wr-hang", "tasks": [{"key": f"h{i}", **hang} for i in range(4)]}
        run_id = start_run(gw, apply(gw, definition))
        try:
            w.wait_log("every slot (2 of 2) holds a hung handler", timeout=30)
            # Both attempts timed out on the server; the other two tasks wait in pending dispatches that this
            # worker could claim (the database counts its slots as free: it holds no lease)...
            wait_until(lambda: pending_dispatches(db_dsn, run_id) >= 1, 10, 0.1, "a pending dispatch")
            first = attempts(db_dsn, run_id)
            assert len(first) == 2
            time.sleep(3.0)  # ...yet in 3 s it claims none of them: no attempt is created and timed out
            later = attempts(db_dsn, run_id)
            assert [(key, n) for key, n, _ in later] == [(key, n) for key, n, _ in first]
            assert {status for _, _, status in later} <= {"timed_out", "interrupted"}
            assert w.log().count("every slot (2 of 2) holds a hung handler") == 1
            assert w.log().count("has not returned") == 2
            assert w.alive()
            signalled = time.monotonic()
            w.signal(signal.SIGTERM)
            assert w.wait_exit(20) == 4
            assert time.monotonic() - signalled >= 3.0 - 0.2  # at the end of its drain deadline, not before
            log = w.log()
            assert "2 hung handler(s) still running at the end of the drain: exiting with code 4" in log
            assert "exiting with code 4" in log and "2 handler(s) hung (2 still running: test-hang" in log
        finally:
            api(gw, "POST", f"/runs/{run_id}/cancel", {})  # no later worker may take the hanging tasks
        assert wait_run(gw, run_id, timeout=15)["status"] in ("canceled", "failed")


def test_a_slot_is_free_only_once_its_handler_has_returned(gw: ServeProcess) -> None:
    with Workers(gw) as ws:
        w = ws.start("slow", executors="python,mock", concurrency=1, extra=["--handlers", TEST_HANDLERS])
        slow_task = python_task("slow", "test-sync-sleep", {"seconds": 3}, timeout_ms=1000)
        slow_run = start_run(gw, apply(gw, {"id": "wr-slow", "tasks": [{**slow_task, "retry": {"max_attempts": 1}}]}))
        wait_task_status(gw, slow_run, "slow", "running")
        next_run = start_run(gw, apply(gw, {"id": "wr-next", "tasks": [mock_task("next")]}))
        assert wait_run(gw, next_run, timeout=30)["status"] == "succeeded"
        slow = task(gw, slow_run, "slow")["attempt_history"]
        assert [a["status"] for a in slow] == ["timed_out"]
        taken = task(gw, next_run, "next")["attempt_history"][0]
        # The slot came back when the handler returned (3 s after it started), not at its timeout (1 s).
        assert seconds_between(slow[0]["started_at"], taken["started_at"]) >= 2.9
        assert "the hung handler returned" in w.log()
        stop(w, 0)  # nothing hangs any more: a clean drain


def test_a_handler_traceback_is_kept_with_its_attempt_and_shown(gw: ServeProcess) -> None:
    """AWP issue 41: a handler's exception -> the attempt's error_detail (its traceback), the worker's WARNING log
    line, and ``awp run task``."""
    from click.testing import CliRunner

    from awp.cli.main import main

    with Workers(gw) as ws:
        w = ws.start("tracer", executors="python", extra=["--handlers", TEST_HANDLERS])
        definition = {
            "id": "traceback",
            "tasks": [{"key": "t", "executor": "python", "action": "test-raise", "input": {"n": 7}}],
        }
        run_id = start_run(gw, apply(gw, definition))
        assert wait_run(gw, run_id)["status"] == "failed"
        [attempt] = task(gw, run_id, "t")["attempt_history"]
        assert attempt["error_code"] == "handler_error" and attempt["error_message"] == "ValueError('boom 7')"
        detail = attempt["error_detail"]
        assert detail.startswith("Traceback (most recent call last):") and "in _deep_helper" in detail
        assert detail.rstrip().endswith("ValueError: boom 7")
        w.wait_log("ValueError: boom 7")  # the traceback, on the WARNING line (control characters escaped: awp.logsafe)
        assert "WARNING awp.executors: handler 'test-raise' failed on t attempt 1:" in w.log()
        env = {"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": gw.tokens.operator, "COLUMNS": "200"}
        shown = CliRunner().invoke(main, ["run", "task", run_id, "t"], env=env, catch_exceptions=False)
        assert "in _deep_helper" in shown.output and "ValueError: boom 7" in shown.output, shown.output
