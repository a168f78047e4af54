"""The worker runtime against a real gateway (``awp serve``) and real PostgreSQL, with real worker processes.

Short timings: lease 2000 ms, heartbeat 200 ms, worker safety margin 300 ms.
"""

from __future__ import annotations

import signal
import socket
import time

import httpx
import psycopg
import pytest
from worker_support import (
    RecordingProxy,
    Workers,
    all_items,
    api,
    apply,
    mock_task,
    set_settings,
    start_run,
    task,
    tasks,
    wait_run,
    wait_task_status,
)

from awp_testing.gateway import PROTOCOL, ServeProcess, bearer, start_serve, wait_until

GATEWAY_SETTINGS = {"lease_duration_ms": 2000, "heartbeat_interval_ms": 200}


@pytest.fixture(scope="module")
def fast_db(db_dsn: str) -> str:
    set_settings(db_dsn, **GATEWAY_SETTINGS)
    return db_dsn


def worker_row(gw: ServeProcess, name: str) -> dict:
    rows = [w for w in all_items(gw, "/workers") if w["display_name"] == name]
    return rows[-1] if rows else {}


def test_dag_runs_to_success_across_two_workers(gw: ServeProcess, workers: Workers) -> None:
    for w in (workers.start("dag-1"), workers.start("dag-2")):
        w.wait_log("registered as")
    fan = [mock_task(f"mid-{i}", ["start"], sleep_ms=300) for i in range(6)]
    definition = {
        "id": "wk-dag",
        "tasks": [mock_task("start", sleep_ms=50), *fan, mock_task("end", [t["key"] for t in fan])],
    }
    run_id = start_run(gw, apply(gw, definition))
    assert wait_run(gw, run_id)["status"] == "succeeded"
    all_tasks = tasks(gw, run_id)
    assert {t["status"] for t in all_tasks.values()} == {"succeeded"}
    owners = {task(gw, run_id, key)["attempt_history"][0]["worker_id"] for key in all_tasks}
    assert len(owners) == 2, "both workers took part"
    out = task(gw, run_id, "end")["attempt_history"][0]["output"]
    assert out == {"task": "end", "action": "end", "attempt": 1}


def test_fail_attempts_retries_then_succeeds(gw: ServeProcess, workers: Workers) -> None:
    workers.start("flaky")
    run_id = start_run(gw, apply(gw, {"id": "wk-flaky", "tasks": [mock_task("f", max_attempts=3, fail_attempts=2)]}))
    assert wait_run(gw, run_id)["status"] == "succeeded"
    history = task(gw, run_id, "f")["attempt_history"]
    assert [a["status"] for a in history] == ["failed", "failed", "succeeded"]
    assert history[0]["error_code"] == "mock_flaky"


def test_permanent_failure_fails_the_run_and_skips_descendants(gw: ServeProcess, workers: Workers) -> None:
    workers.start("perm")
    definition = {
        "id": "wk-perm",
        "tasks": [
            mock_task("a"),
            mock_task("bad", ["a"], max_attempts=3, fail="permanent"),
            mock_task("after-bad", ["bad"]),
            mock_task("independent", ["a"], sleep_ms=100),
        ],
    }
    run_id = start_run(gw, apply(gw, definition))
    assert wait_run(gw, run_id)["status"] == "failed"
    status = {k: t["status"] for k, t in tasks(gw, run_id).items()}
    assert status == {"a": "succeeded", "bad": "failed", "after-bad": "skipped", "independent": "succeeded"}
    assert tasks(gw, run_id)["bad"]["attempts"] == 1, "a permanent failure is not retried"


def test_an_action_no_worker_has_waits_instead_of_failing(gw: ServeProcess, workers: Workers) -> None:
    # Routing by action (docs/protocol.md, Routing): the python worker registered the handlers it has, so it never
    # claims "no-such-action" (which once failed for good as unknown_action); the task waits, with the reason.
    workers.start("py", executors="mock,python", extra=["--handlers", "examples/handlers.py"])
    definition = {
        "id": "wk-unknown",
        "tasks": [
            {"key": "known", "executor": "python", "action": "word-count", "input": {"text": "a b c"}},
            {
                "key": "unknown",
                "executor": "python",
                "action": "no-such-action",
                "input": {},
                "retry": {"max_attempts": 3, "interval_ms": 0},
            },
        ],
    }
    run_id = start_run(gw, apply(gw, definition))
    wait_until(lambda: task(gw, run_id, "known")["status"] == "succeeded", 30, 0.1, "known succeeds")
    assert task(gw, run_id, "known")["attempt_history"][0]["output"] == {"words": 3}
    unknown = wait_until(
        lambda: (t := task(gw, run_id, "unknown"))["wait_reason"] == "no_worker_for_action" and t, 15, 0.1, "waits"
    )
    assert unknown["status"] == "ready" and unknown["attempts"] == 0, unknown
    api(gw, "POST", f"/runs/{run_id}/cancel", {})
    assert wait_run(gw, run_id)["status"] == "canceled"


def test_sigterm_while_busy_drains_and_stops(gw: ServeProcess, workers: Workers) -> None:
    w = workers.start("drainer", concurrency=2)
    definition = {"id": "wk-drain", "tasks": [mock_task("slow-1", sleep_ms=1500), mock_task("slow-2", sleep_ms=1500)]}
    run_id = start_run(gw, apply(gw, definition))
    wait_until(lambda: worker_row(gw, "drainer").get("active_leases") == 2, 10, 0.05, "two leases")
    w.signal(signal.SIGTERM)
    wait_until(lambda: worker_row(gw, "drainer").get("status") == "draining", 5, 0.02, "draining")
    assert w.wait_exit(15) == 0
    assert worker_row(gw, "drainer")["status"] == "stopped"
    assert wait_run(gw, run_id)["status"] == "succeeded"
    for key in ("slow-1", "slow-2"):
        assert [a["status"] for a in task(gw, run_id, key)["attempt_history"]] == ["succeeded"]
    assert "drain: worker" in w.log()


def test_cancel_revokes_the_running_execution(gw: ServeProcess, workers: Workers) -> None:
    w = workers.start("cancelled")
    run_id = start_run(gw, apply(gw, {"id": "wk-cancel", "tasks": [mock_task("long", sleep_ms=30000)]}))
    wait_task_status(gw, run_id, "long", "running")
    api(gw, "POST", f"/runs/{run_id}/cancel", {})
    w.wait_log("heartbeat answered revoked; execution cancelled, not completing", timeout=5)
    assert wait_run(gw, run_id, timeout=10)["status"] == "canceled"
    attempt = task(gw, run_id, "long")["attempt_history"][0]
    assert attempt["status"] == "canceled"
    assert "completed" not in w.log(), "a revoked execution is never completed"
    assert w.alive()


def test_worker_session_invalid_exits_non_zero(gw: ServeProcess, workers: Workers, fast_db: str) -> None:
    w = workers.start("doomed")
    w.wait_log("registered as")
    worker_id = worker_row(gw, "doomed")["worker_id"]
    with psycopg.connect(fast_db, autocommit=True) as c:
        c.execute("UPDATE awp.workers SET status = 'offline', offline_at = now() WHERE worker_id = %s", (worker_id,))
    assert w.wait_exit(10) == 3
    assert "session invalid" in w.log()


def test_drained_by_an_operator_the_worker_stops_and_exits_zero(
    gw: ServeProcess, workers: Workers, fast_db: str
) -> None:
    w = workers.start("operator-drained")
    w.wait_log("registered as")
    worker_id = worker_row(gw, "operator-drained")["worker_id"]
    with psycopg.connect(fast_db, autocommit=True) as c:
        c.execute("UPDATE awp.workers SET status = 'draining', draining_at = now() WHERE worker_id = %s", (worker_id,))
    assert w.wait_exit(10) == 0
    assert worker_row(gw, "operator-drained")["status"] == "stopped"


def test_rejected_bootstrap_token_is_fatal(gw: ServeProcess, workers: Workers) -> None:
    w = workers.start("bad-token", env={"AWP_WORKER_BOOTSTRAP_TOKEN": "not-the-token"})
    assert w.wait_exit(10) == 2
    assert "registration rejected" in w.log()


def test_unreachable_gateway_is_retried_not_fatal() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Workers(None, f"http://127.0.0.1:{port}", "whatever") as ws:
        w = ws.start("lonely")
        w.wait_log("retrying registration", timeout=10)
        time.sleep(1.0)
        assert w.alive()
        w.signal(signal.SIGTERM)
        assert w.wait_exit(10) == 0


def test_local_deadline_cancels_execution_when_the_gateway_is_down(fast_db: str) -> None:
    gateway = start_serve(fast_db)
    try:
        with Workers(gateway) as ws:
            w = ws.start("orphan")
            definition = {"id": "wk-deadline", "tasks": [mock_task("long", sleep_ms=30000)]}
            run_id = start_run(gateway, apply(gateway, definition))
            wait_task_status(gateway, run_id, "long", "running")
            w.wait_log("claimed")
            gateway.kill()
            # The local deadline is at most lease - margin (1.7 s) after the last renewal; the timeout only bounds
            # a hang (a worker that never gives up).
            w.wait_log("local safety deadline passed; execution cancelled, not completing", timeout=10)
            time.sleep(0.5)  # a moment later (heartbeats keep failing), the worker is still running
            assert w.alive(), "a network error is not fatal"
            assert "heartbeat failed" in w.log()
            # A new gateway on the same database: the lease expired there too (the attempt is interrupted,
            # never completed), and the run ends, so no other test inherits it.
            replacement = start_serve(fast_db)
            try:
                api(replacement, "POST", f"/runs/{run_id}/cancel", {})
                assert wait_run(replacement, run_id, timeout=10)["status"] in ("failed", "canceled")
                attempt = task(replacement, run_id, "long")["attempt_history"][0]
                assert attempt["status"] in ("interrupted", "canceled")
                assert "completed" not in w.log()
            finally:
                replacement.stop()
    finally:
        gateway.kill()


def test_a_task_over_its_timeout_times_out_is_retried_and_its_late_result_is_fenced(
    gw: ServeProcess, fast_db: str
) -> None:
    """A real worker runs a mock task that sleeps 5 s under timeout_ms 800 (lease 2000 ms, margin 300 ms).

    The worker cancels the execution at its local deadline (attempt deadline - margin, measured on its own clock)
    and sends no result; the server times the attempt out at the deadline and retries it per policy
    (max_attempts 2: once), then fails the task and skips its dependant. The late result is fenced off: completing
    attempt 1 with its own lease token (recorded from the worker's claim by a proxy) is 409 lease_lost and changes
    nothing."""
    proxy = RecordingProxy(gw.base_url)
    try:
        with Workers(gw, proxy.url, gw.tokens.bootstrap) as ws:
            w = ws.start("overtime", concurrency=1)
            slow = {**mock_task("slow", max_attempts=2, sleep_ms=5000), "timeout_ms": 800}
            run_id = start_run(gw, apply(gw, {"id": "wk-timeout", "tasks": [slow, mock_task("after", ["slow"])]}))
            assert wait_run(gw, run_id, timeout=20)["status"] == "failed"
            history = task(gw, run_id, "slow")["attempt_history"]
            assert [(a["attempt"], a["status"], a["error_code"]) for a in history] == [
                (1, "timed_out", "attempt_timeout"),
                (2, "timed_out", "attempt_timeout"),
            ]
            assert [a["output"] for a in history] == [None, None]
            assert tasks(gw, run_id)["after"]["status"] == "skipped"
            # Each execution was given up by the worker itself, and no result was ever sent for it.
            cancelled = "local safety deadline passed; execution cancelled, not completing"
            wait_until(lambda: w.log().count(cancelled) == 2, 5, 0.05, "two local cancellations in the log")
            assert proxy.find("/complete") == [] and proxy.find("/completions") == []
            leases = [x for x in proxy.leases() if x["run_id"] == run_id and x["task_key"] == "slow"]
            assert [x["attempt"] for x in leases] == [1, 2], "the worker received both attempts"

            session = proxy.find("/workers/register")[0]["response"]
            with psycopg.connect(fast_db, autocommit=True) as c:
                before = c.execute(
                    "SELECT revision, last_sequence FROM awp.runs WHERE run_id = %s", [run_id]
                ).fetchone()
                late = httpx.post(
                    gw.api(f"/workers/{session['worker_id']}/leases/{leases[0]['dispatch_id']}/complete"),
                    json={
                        "lease_token": leases[0]["lease_token"],
                        "result": {"kind": "success", "output": {"late": 1}},
                    },
                    headers={**bearer(session["session_token"]), **PROTOCOL},
                    timeout=10,
                )
                assert late.status_code == 409 and late.json()["error"]["code"] == "lease_lost", late.text
                after = c.execute("SELECT revision, last_sequence FROM awp.runs WHERE run_id = %s", [run_id]).fetchone()
                assert after == before, "the refused result changed nothing"
                dispatch = c.execute(
                    "SELECT status, result_hash FROM awp.dispatches WHERE dispatch_id = %s", [leases[0]["dispatch_id"]]
                ).fetchone()
                assert dispatch == ("expired", None)
            assert w.alive()
            w.signal(signal.SIGTERM)
            assert w.wait_exit(10) == 0
    finally:
        proxy.close()
