"""Waiting without a worker, end to end (docs/waits.md): an approval step signalled over HTTP and the CLI (its
idempotency and its errors), a rejection skipping the step after it, a durable sleep, backoff; and a fault: the
gateway and PostgreSQL restarted while a signal wait and a sleep are pending, both end correctly."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from fault_support import assert_clean, configure, own_cluster, query, stoppable_database, wait_run_db
from worker_support import SHORT_LEASES, Workers, apply, mock_task, start_run, task, tasks, wait_run

from awp.cli.main import main
from awp.dev.localdb import Cluster
from awp_testing.gateway import ServeProcess, start_serve, wait_until

GATEWAY_SETTINGS = SHORT_LEASES


def approval_flow(wid: str) -> dict[str, Any]:
    return {
        "id": wid,
        "tasks": [
            mock_task("draft", output={"title": "t"}),
            {"key": "approval", "executor": "signal", "depends_on": ["draft"], "input": {"timeout_ms": 600000}},
            {
                **mock_task("publish", ["approval"], echo=True),
                "when": {"task": "approval", "path": ["approved"], "equals": True},
            },
        ],
    }


def signal(gw: ServeProcess, run_id: str, key: str, payload: Any, idem: str | None = None) -> httpx.Response:
    headers = {**gw.auth("operator"), **({"Idempotency-Key": idem} if idem else {})}
    return httpx.post(
        gw.api(f"/runs/{run_id}/tasks/{key}/signal"), json={"payload": payload}, headers=headers, timeout=10
    )


def waiting_signal(gw: ServeProcess, run_id: str) -> dict[str, Any]:
    return wait_until(
        lambda: (t := tasks(gw, run_id)["approval"])["wait_reason"] == "waiting_signal" and t,
        15,
        0.05,
        "the approval waits",
    )


def test_an_approval_waits_for_its_signal(gw: ServeProcess, workers: Workers) -> None:
    workers.start("sig-w", concurrency=2)
    run_id = start_run(gw, apply(gw, approval_flow("sig-approve")))
    waiting = waiting_signal(gw, run_id)
    assert waiting["status"] == "running" and "POST /api/v1/runs/" in waiting["wait_detail"]
    assert signal(gw, run_id, "approval", [1]).status_code == 400  # a payload is an object
    miss = signal(gw, run_id, "nope", {})
    assert (miss.status_code, miss.json()["error"]["code"]) == (404, "not_found")
    wrong = signal(gw, run_id, "draft", {})
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (409, "signal_not_waiting")
    first = signal(gw, run_id, "approval", {"approved": True, "by": "ann"}, "ann-1")
    assert first.status_code == 200, first.text
    assert {k: first.json()[k] for k in ("task_key", "status", "attempt")} == {
        "task_key": "approval",
        "status": "succeeded",
        "attempt": 1,
    }
    again = signal(gw, run_id, "approval", {"by": "ann", "approved": True}, "ann-1")
    assert again.status_code == 200 and again.json()["received_at"] == first.json()["received_at"]
    other = signal(gw, run_id, "approval", {"approved": False}, "ann-1")
    assert (other.status_code, other.json()["error"]["code"]) == (409, "idempotency_conflict")
    late = signal(gw, run_id, "approval", {"approved": True})
    assert (late.status_code, late.json()["error"]["code"]) == (409, "signal_not_waiting")
    run = wait_run(gw, run_id)
    assert run["status"] == "succeeded"
    assert run["output"]["publish"]["upstream"] == {"approval": {"approved": True, "by": "ann"}}


def test_a_rejection_from_the_cli_skips_what_needs_approval(gw: ServeProcess, workers: Workers) -> None:
    workers.start("sig-cli", concurrency=2)
    run_id = start_run(gw, apply(gw, approval_flow("sig-reject")))
    waiting_signal(gw, run_id)
    env = {"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": gw.tokens.operator, "COLUMNS": "200"}
    sent = CliRunner().invoke(
        main, ["run", "signal", run_id, "approval", "--payload", '{"approved": false}'], env=env, catch_exceptions=False
    )
    assert sent.exit_code == 0 and "the task is succeeded" in sent.output, sent.output
    again = CliRunner().invoke(main, ["run", "signal", run_id, "approval"], env=env, catch_exceptions=False)
    assert again.exit_code != 0 and "signal_not_waiting" in again.output, again.output
    run = wait_run(gw, run_id)
    assert run["status"] == "succeeded"
    publish = tasks(gw, run_id)["publish"]
    assert (publish["status"], publish["skip_reason"]) == ("skipped", "condition_false")


def test_a_sleep_and_a_backoff(gw: ServeProcess, workers: Workers, db_dsn: str) -> None:
    workers.start("sig-sleep", concurrency=2)
    definition = {
        "id": "sig-sleep",
        "tasks": [
            {"key": "nap", "executor": "sleep", "input": {"sleep_ms": 400}},
            {
                **mock_task("flaky", ["nap"], fail_attempts=2),
                "retry": {"max_attempts": 3, "interval_ms": 200, "backoff": 2},
            },
        ],
    }
    run_id = start_run(gw, apply(gw, definition))
    nap = wait_until(lambda: (t := tasks(gw, run_id)["nap"])["wait_reason"] == "sleeping" and t, 10, 0.02, "a sleep")
    assert nap["wait_detail"].startswith("sleeping until ")
    run = wait_run(gw, run_id)
    assert run["status"] == "succeeded"
    assert set(task(gw, run_id, "nap")["output"]) == {"slept_until"}
    started = [a["started_at"] for a in task(gw, run_id, "flaky")["attempt_history"]]
    ends = [a["finished_at"] for a in task(gw, run_id, "flaky")["attempt_history"]]
    gaps = [
        (
            query(db_dsn, "SELECT %s::timestamptz - %s::timestamptz AS d", (started[i + 1], ends[i]))[0]["d"]
        ).total_seconds()
        for i in range(2)
    ]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4, gaps  # 200 ms, then 400 ms (backoff 2)


@pytest.mark.slow
def test_a_signal_wait_and_a_sleep_survive_restarts_of_the_gateway_and_postgresql() -> None:
    with own_cluster() as cluster, stoppable_database(cluster, "signals_restart") as dsn:
        configure(dsn)
        gw = start_serve(dsn, coordinator_interval_ms=100)
        tokens, port = gw.tokens, gw.port
        try:
            definition = {
                "id": "sig-restart",
                "tasks": [
                    {"key": "approval", "executor": "signal"},
                    {"key": "nap", "executor": "sleep", "input": {"sleep_ms": 4000}},
                ],
            }
            run_id = start_run(gw, apply(gw, definition))
            wait_until(
                lambda: {t["status"] for t in tasks(gw, run_id).values()} == {"running"}, 15, 0.05, "both waiting"
            )
            gw.kill()
            _restart(cluster)
            gw = start_serve(dsn, tokens=tokens, coordinator_interval_ms=100, port=port)
            wait_until(gw.coordinator_active, 30, 0.05, "the coordinator back")
            r = signal(gw, run_id, "approval", {"approved": True}, "after-restart")
            assert r.status_code == 200, r.text
            assert wait_run_db(dsn, run_id, 30)["status"] == "succeeded"
            rows = query(dsn, "SELECT task_key, status, attempts FROM awp.run_tasks(%s)", (run_id,))
            assert {r["task_key"]: (r["status"], r["attempts"]) for r in rows} == {
                "approval": ("succeeded", 1),
                "nap": ("succeeded", 1),
            }
            assert_clean(dsn)
        finally:
            gw.stop()


def _restart(cluster: Cluster) -> None:
    cluster.stop(mode="immediate")
    time.sleep(1.0)
    cluster.start(fsync=False)


def test_the_approval_example_applies_and_runs(gw: ServeProcess, workers: Workers) -> None:
    """examples/approval.yaml: its draft waits for the openai limit until it is defined, then approved over HTTP it
    sleeps, then publishes after a retry with backoff."""
    import yaml
    from worker_support import REPO

    workers.start("sig-example", concurrency=2)
    definition = yaml.safe_load((REPO / "examples" / "approval.yaml").read_text())
    httpx.delete(gw.api("/limits/openai"), headers=gw.auth("operator"), timeout=10)
    run_id = start_run(gw, apply(gw, definition))
    held = wait_until(lambda: (t := task(gw, run_id, "draft"))["wait_reason"] == "rate_limited" and t, 15, 0.05, "held")
    assert held["wait_detail"].startswith("limit openai is not defined"), held
    limit = {"max_in_flight": 4, "per_window": 60, "window_ms": 60000}
    assert httpx.put(gw.api("/limits/openai"), json=limit, headers=gw.auth("operator"), timeout=10).status_code == 200
    waiting_signal(gw, run_id)
    assert signal(gw, run_id, "approval", {"approved": True}).status_code == 200
    run = wait_run(gw, run_id, 60)
    assert run["status"] == "succeeded", tasks(gw, run_id)
    assert task(gw, run_id, "publish")["attempts"] == 2
