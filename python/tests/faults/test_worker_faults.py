"""Worker faults with real processes: network partitions, kill -9, repeated signals, shutdown timeouts, and
python handlers' context and limits. Lease 2000 ms, heartbeat 200 ms, safety margin 300 ms."""

from __future__ import annotations

import signal

import pytest
from worker_support import (
    TcpProxy,
    Workers,
    all_items,
    api,
    apply,
    get_run,
    mock_task,
    start_run,
    task,
    wait_run,
    wait_task_status,
)

from awp_testing.gateway import ServeProcess, wait_until

pytestmark = pytest.mark.slow  # multi-process / long: make test-fast skips it

TEST_HANDLERS = "python/tests/handlers_for_tests.py"


# A worker goes offline after 2 s of silence (10 heartbeats), not the default 600 ms: the partition test cuts the
# network for the 500 ms its task runs plus the time to notice, and a worker of a healthy partition that short must
# not lose its session (nothing here tests offline marking).
GATEWAY_SETTINGS = {"lease_duration_ms": 2000, "heartbeat_interval_ms": 200, "offline_after_heartbeats": 10}


def worker_ids(gw: ServeProcess) -> dict[str, str]:
    return {w["worker_id"]: w["display_name"] for w in all_items(gw, "/workers")}


def test_short_partition_is_survived_and_complete_is_retried(gw: ServeProcess) -> None:
    proxy = TcpProxy(gw.port)
    try:
        with Workers(gw, proxy.url, gw.tokens.bootstrap) as ws:
            w = ws.start("partitioned")
            run_id = start_run(gw, apply(gw, {"id": "fa-partition", "tasks": [mock_task("t", sleep_ms=500)]}))
            wait_task_status(gw, run_id, "t", "running")
            proxy.cut()  # the task finishes during the partition: its complete fails and is retried
            w.wait_log("complete failed", timeout=5)
            proxy.restore()
            assert wait_run(gw, run_id, timeout=10)["status"] == "succeeded"
            assert [a["status"] for a in task(gw, run_id, "t")["attempt_history"]] == ["succeeded"]
            w.wait_log("completed")
            assert w.alive()
            w.signal(signal.SIGTERM)
            assert w.wait_exit(10) == 0
    finally:
        proxy.close()


def test_killed_worker_is_replaced_by_second_attempt(gw: ServeProcess) -> None:
    with Workers(gw) as ws:
        procs = {name: ws.start(name, concurrency=1) for name in ("kill-a", "kill-b")}
        for w in procs.values():
            w.wait_log("registered as")
        definition = {"id": "fa-kill", "tasks": [mock_task("long", max_attempts=2, sleep_ms=2500)]}
        run_id = start_run(gw, apply(gw, definition))
        # The worker's own log says first who holds the lease: kill it at once, well before the task ends.
        victim = wait_until(lambda: next((n for n, w in procs.items() if "claimed" in w.log()), None), 10, 0.01)
        procs[victim].kill()
        survivor = next(name for name in procs if name != victim)
        names = worker_ids(gw)
        assert wait_run(gw, run_id, timeout=15)["status"] == "succeeded"
        history = task(gw, run_id, "long")["attempt_history"]
        assert [(a["status"], names[a["worker_id"]]) for a in history] == [
            ("interrupted", victim),
            ("succeeded", survivor),
        ]
        assert history[1]["fencing_token"] > history[0]["fencing_token"]
        procs[survivor].signal(signal.SIGTERM)
        assert procs[survivor].wait_exit(10) == 0


def test_second_signal_exits_at_once(gw: ServeProcess) -> None:
    with Workers(gw) as ws:
        w = ws.start("impatient", shutdown_timeout=30)
        run_id = start_run(gw, apply(gw, {"id": "fa-twice", "tasks": [mock_task("long", sleep_ms=30000)]}))
        wait_task_status(gw, run_id, "long", "running")
        w.signal(signal.SIGTERM)
        w.wait_log("draining")
        w.signal(signal.SIGINT)
        # Exit code 130 is the second-signal path (os._exit): the drain (shutdown timeout 30 s, a 30 s task) was
        # not waited for. The timeout only bounds a hang.
        assert w.wait_exit(10) == 130
        assert "second SIGINT: exiting at once" in w.log()
        api(gw, "POST", f"/runs/{run_id}/cancel", {})
        assert wait_run(gw, run_id, timeout=10)["status"] == "canceled"


def test_shutdown_timeout_cancels_what_is_left_and_exits_zero(gw: ServeProcess) -> None:
    with Workers(gw) as ws:
        w = ws.start("hurried", shutdown_timeout=1)
        run_id = start_run(gw, apply(gw, {"id": "fa-timeout", "tasks": [mock_task("long", sleep_ms=30000)]}))
        wait_task_status(gw, run_id, "long", "running")
        w.signal(signal.SIGTERM)
        assert w.wait_exit(15) == 0  # long before the 30 s task could end: the timeout only bounds a hang
        assert "shutdown timeout" in w.log()
        assert "completed" not in w.log()
        # The abandoned lease was released (docs/protocol.md, Draining): the attempt is interrupted, does not count
        # against max_attempts 1, and the task is due again at once instead of failing the run.
        assert "released" in w.log(), w.log()[-2000:]
        back = ("ready", "queued", "waiting_retry")
        long = wait_until(lambda: (t := task(gw, run_id, "long"))["status"] in back and t, 10, 0.05, "requeued")
        first = long["attempt_history"][0]
        assert (first["status"], first["error_code"]) == ("interrupted", "worker_shutdown"), first
        assert get_run(gw, run_id)["status"] == "running"
        api(gw, "POST", f"/runs/{run_id}/cancel", {})


def test_python_handlers_get_context_and_limits_apply(gw: ServeProcess) -> None:
    def py(key: str, action: str, attempts: int = 1) -> dict:
        return {
            "key": key,
            "executor": "python",
            "action": action,
            "input": {},
            "retry": {"max_attempts": attempts, "interval_ms": 0},
        }

    with Workers(gw) as ws:
        w = ws.start("py", executors="python", extra=["--handlers", TEST_HANDLERS])
        definition = {
            "id": "fa-python",
            "tasks": [py("ctx", "test-context"), py("big", "test-big-output"), py("flaky", "test-flaky", 2)],
        }
        run_id = start_run(gw, apply(gw, definition))
        assert wait_run(gw, run_id)["status"] == "failed"  # because of "big"
        ctx = task(gw, run_id, "ctx")["attempt_history"][0]
        assert ctx["output"] == {
            "run_id": run_id,
            "task_key": "ctx",
            "attempt": 1,
            "fencing_token": ctx["fencing_token"],
            "idempotency_key": f"{run_id}:ctx",
            "remaining_ok": True,
        }
        big = task(gw, run_id, "big")["attempt_history"][0]
        assert (big["status"], big["error_code"]) == ("failed", "output_too_large")
        flaky = task(gw, run_id, "flaky")["attempt_history"]
        assert [a["status"] for a in flaky] == ["failed", "succeeded"]
        assert flaky[0]["error_code"] == "handler_error"
        assert flaky[0]["error_message"] == "ConnectionError('upstream hiccup')"
        assert w.alive()
        w.signal(signal.SIGTERM)
        assert w.wait_exit(10) == 0


def test_a_stuck_sync_handler_does_not_keep_the_worker_alive(gw: ServeProcess) -> None:
    with Workers(gw) as ws:
        w = ws.start("stuck", executors="python", shutdown_timeout=1, extra=["--handlers", TEST_HANDLERS])
        definition = {
            "id": "fa-stuck",
            "tasks": [{"key": "s", "executor": "python", "action": "test-sync-sleep", "input": {"seconds": 60}}],
        }
        run_id = start_run(gw, apply(gw, definition))
        wait_task_status(gw, run_id, "s", "running")
        w.signal(signal.SIGTERM)
        # The handler sleeps 60 s: the drain ends at its deadline with the thread still running, exit code 4 (a
        # hung handler: restart the worker). The timeout only bounds a hang.
        assert w.wait_exit(15) == 4
        assert "sync handler thread(s) still running" in w.log()
        api(gw, "POST", f"/runs/{run_id}/cancel", {})
        assert wait_run(gw, run_id, timeout=10)["status"] in ("canceled", "failed")
