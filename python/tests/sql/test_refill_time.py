"""A refill's attempt never starts before its dependencies finished (``check_invariants``: started_before_deps).

A completion that claims reads the clock (its ``v_now``) once it holds its run, and refills the worker's slot from
the first run in fairness order, which may be another run. A dependency in that other run can be completed by
another transaction after that clock read and before the refill sees its dependant ready: the refill's attempt,
stamped with the completion's time, then started before its dependency finished. Seen in the soak
(python/tests/faults/test_soak.py) on a busy machine, twice in four runs. Now a refill in a run other than the ones
the call completed reads the clock again, after it saw the task ready (awp._lease_refill, and the group path
awp._complete_and_refill_group).

The interleaving is made here: a second session holds the row of the completed task's dependant, so the completion
waits there (``pg_blocking_pids``) after its clock read; meanwhile another worker completes the dependency in the
other run; then the row is released and the completion's refill takes the dependant that just became ready.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest
from sync_support import connect, in_thread, wait_blocked

from awp_testing.cluster import DictConnection, one

SUCCESS = '{"kind": "success", "output": {"ok": 1}}'


def workflow(db: DictConnection, tasks: list[dict[str, Any]], concurrency: int = 10) -> str:
    wid = f"refill-time-{secrets.token_hex(4)}"
    definition = {"id": wid, "concurrency": concurrency, "tasks": tasks}
    db.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps(definition)])
    return wid


def started_and_leased(db: DictConnection, wid: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A run of ``wid`` started, its first task dispatched and leased to a new worker of one slot."""
    run_id = one(db, "SELECT awp.start_run(%s) AS r", [wid])["r"]
    worker = one(db, "SELECT * FROM awp.register_worker('w', ARRAY['mock'], 1)")
    db.execute("SELECT awp.coordinator_tick()")
    lease = one(
        db,
        "SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 1)",
        [worker["worker_id"], worker["session_token"]],
    )
    return run_id, worker, lease


def item(worker: dict[str, Any], lease: dict[str, Any]) -> dict[str, Any]:
    return {
        "worker_id": worker["worker_id"],
        "session_token": worker["session_token"],
        "dispatch_id": lease["dispatch_id"],
        "lease_token": lease["lease_token"],
        "result": json.loads(SUCCESS),
        "slots": 1,
        "claim_seq": None,
    }


@pytest.mark.parametrize("path", ["single", "group"])
def test_a_refill_in_another_run_starts_after_the_dependency_that_made_it_ready(db, db_dsn, path):
    # The other run first (its first dispatch is the oldest: first in fairness order): a, then c after a.
    other, w2, a = started_and_leased(
        db, workflow(db, [{"key": "a", "executor": "mock"}, {"key": "c", "executor": "mock", "depends_on": ["a"]}])
    )
    # The completed run: x, then x2 after x (the row the completion waits for).
    done, w1, x = started_and_leased(
        db, workflow(db, [{"key": "x", "executor": "mock"}, {"key": "x2", "executor": "mock", "depends_on": ["x"]}])
    )
    runs = [other, done]
    items = [item(w1, x)]
    if path == "group":  # a second worker's completion in a third run, refilled there (y2 waits for y's slot)
        third, w3, y = started_and_leased(
            db, workflow(db, [{"key": "y", "executor": "mock"}, {"key": "y2", "executor": "mock"}], concurrency=1)
        )
        runs.append(third)
        items.append(item(w3, y))
    # a's worker drains: its completion refills nothing (no dispatch of c is made before the refill looks).
    db.execute("SELECT awp.drain_worker(%s, %s)", [w2["worker_id"], w2["session_token"]])

    with connect(db_dsn) as holder, connect(db_dsn) as completer:
        with holder.transaction():
            holder.execute("SELECT 1 FROM awp.tasks WHERE run_id = %s AND task_key = 'x2' FOR UPDATE", [done])
            if path == "single":
                call = in_thread(
                    lambda: completer.execute(
                        "SELECT dispatch_id, task_key, run_id FROM awp.complete_and_claim(%s, %s, %s, %s, %s, 1)",
                        [w1["worker_id"], w1["session_token"], x["dispatch_id"], x["lease_token"], SUCCESS],
                    ).fetchall()
                )
            else:
                call = in_thread(
                    lambda: completer.execute(
                        "SELECT g.item, g.error, (g.lease).dispatch_id, (g.lease).task_key, (g.lease).run_id"
                        " FROM awp.complete_and_claim_many(%s) g",
                        [json.dumps(items)],
                    ).fetchall()
                )
            # The completion has read its clock and waits for x2's row (making it ready).
            assert wait_blocked(db, completer.info.backend_pid, call) == [holder.info.backend_pid]
            # Meanwhile the dependency in the other run succeeds: c becomes ready.
            assert one(
                db,
                "SELECT awp.complete_task(%s, %s, %s, %s, %s) AS ok",
                [w2["worker_id"], w2["session_token"], a["dispatch_id"], a["lease_token"], SUCCESS],
            )["ok"]
        leases = call.result()

    assert all(r.get("error") is None for r in leases), leases
    assert {(r["run_id"], r["task_key"]) for r in leases if r["dispatch_id"]} >= {(other, "c")}, (
        "the refill took the dependant in the other run"
    )
    times = one(
        db,
        "SELECT (SELECT finished_at FROM awp.dispatches WHERE dispatch_id = %s) AS a_finished,"
        " (SELECT leased_at FROM awp.dispatches WHERE run_id = %s AND task_key = 'c') AS c_started,"
        " (SELECT updated_at FROM awp.tasks WHERE run_id = %s AND task_key = 'c') AS c_updated",
        [a["dispatch_id"], other, other],
    )
    assert times["c_started"] >= times["a_finished"], times
    assert times["c_updated"] == times["c_started"], "the task's row and its attempt carry the same start"
    assert db.execute("SELECT * FROM awp.check_invariants(%s)", [runs]).fetchall() == []
    for run_id in runs:  # nothing left live for the module's next test
        db.execute("SELECT awp.request_cancel(%s)", [run_id])
