"""The lock protocol, observed directly: what a call holds while it waits, shown with ``pg_blocking_pids`` and
``pg_locks`` instead of inferred from timing.

- complete_task takes the run's advisory lock, then the run row, then the dispatch row (Run before Dispatch,
  as everywhere): while it waits for the run it holds the advisory lock and not the dispatch;
- every transaction that adds pending dispatches queues on one advisory lock before it reads the budget, so
  two of them can never both spend the last unit of ``dispatch_limit``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from sync_support import in_thread, wait_blocked

from awp_testing.cluster import DictConnection, one


def connect(dsn: str) -> psycopg.Connection[dict[str, Any]]:
    return psycopg.connect(dsn, autocommit=True, row_factory=dict_row)


@pytest.fixture
def db(db_dsn: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with connect(db_dsn) as c:
        c.execute("TRUNCATE awp.events, awp.dispatches, awp.tasks, awp.runs, awp.workers CASCADE")
        c.execute(
            "SELECT awp.configure(lease_duration_ms => 15000, heartbeat_interval_ms => 5000, dispatch_limit => 100)"
        )
        yield c


def start(c: DictConnection, wid: str, n: int = 1) -> str:
    tasks = [{"key": f"t{i}", "executor": "mock"} for i in range(n)]
    c.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps({"id": wid, "tasks": tasks})])
    return one(c, "SELECT awp.start_run(%s) AS id", [wid])["id"]


def register(c: DictConnection, name: str, slots: int = 1) -> tuple[str, str]:
    row = one(c, "SELECT * FROM awp.register_worker(%s, ARRAY['mock'], %s)", [name, slots])
    return row["worker_id"], row["session_token"]


def test_complete_queues_on_the_run_lock_holding_its_advisory_lock_but_not_the_dispatch(db, db_dsn):
    run_id = start(db, "order")
    worker = register(db, "w")
    db.execute("SELECT awp.coordinator_tick()")
    [lease] = db.execute("SELECT * FROM awp.claim_tasks(%s, %s, 1)", list(worker)).fetchall()
    result = json.dumps({"kind": "success"})
    with connect(db_dsn) as holder, connect(db_dsn) as completer, connect(db_dsn) as probe:
        with holder.transaction():
            holder.execute("SELECT 1 FROM awp.runs WHERE run_id = %s FOR UPDATE", [run_id])
            call = in_thread(
                lambda: one(
                    completer,
                    "SELECT awp.complete_task(%s, %s, %s, %s, %s) AS ok",
                    [*worker, lease["dispatch_id"], lease["lease_token"], result],
                )["ok"]
            )
            pid = completer.info.backend_pid
            assert wait_blocked(db, pid, call) == [holder.info.backend_pid], "complete waits for the run row"
            advisory = db.execute(
                "SELECT granted FROM pg_locks WHERE pid = %s AND locktype = 'advisory'", [pid]
            ).fetchall()
            assert advisory == [{"granted": True}], "it queues holding the run's advisory lock"
            # The dispatch is not locked yet: another session can take it without waiting (NOWAIT).
            probe.execute(
                "SELECT 1 FROM awp.dispatches WHERE dispatch_id = %s FOR UPDATE NOWAIT", [lease["dispatch_id"]]
            )
        assert call.result() is True
    assert db.execute("SELECT status FROM awp.runs WHERE run_id = %s", [run_id]).fetchone()["status"] == "succeeded"


def test_dispatch_creators_queue_on_the_budget_lock_and_never_overspend(db, db_dsn):
    db.execute("SELECT awp.configure(dispatch_limit => 1)")
    register(db, "w", 4)
    with connect(db_dsn) as first, connect(db_dsn) as second:
        with first.transaction():
            first_run = start(first, "first")  # a run start creates its dispatch under the budget lock
            call = in_thread(lambda: start(second, "second"))
            assert wait_blocked(db, second.info.backend_pid, call) == [first.info.backend_pid]
            waiting = db.execute(
                "SELECT locktype FROM pg_locks WHERE pid = %s AND NOT granted", [second.info.backend_pid]
            ).fetchall()
            assert waiting == [{"locktype": "advisory"}], "the second one waits for the budget's advisory lock"
        second_run = call.result()
    live = db.execute(
        "SELECT run_id FROM awp.dispatches WHERE status IN ('pending', 'leased') ORDER BY created_at"
    ).fetchall()
    assert [x["run_id"] for x in live] == [first_run], "dispatch_limit 1: the second run got nothing"
    assert db.execute("SELECT status FROM awp.runs WHERE run_id = %s", [second_run]).fetchone()["status"] == "pending"
    assert db.execute("SELECT * FROM awp.check_invariants()").fetchall() == []


def test_a_grouped_refill_skips_a_run_held_elsewhere_as_a_single_refill_does(db, db_dsn):
    """The group path takes a run it meets first for a refill without waiting (awp._try_run), like
    awp._lease_refill: a run whose lock another session holds is skipped, and the refill goes to the next run
    in fairness order (found broken once: the group path then failed on an unassigned record, a 500)."""
    db.execute("SELECT awp.configure(dispatch_limit => 6)")  # every run keeps room, no dispatch left pending
    for wid in ("a", "b", "c"):
        tasks = [{"key": f"t{i}", "executor": "mock"} for i in range(6)]
        db.execute(
            "SELECT * FROM awp.create_workflow_version(%s)", [json.dumps({"id": wid, "concurrency": 4, "tasks": tasks})]
        )
        db.execute("SELECT awp.start_run(%s)", [wid])
    workers = [register(db, f"w{i}") for i in range(6)]
    db.execute("SELECT awp.coordinator_tick()")
    held = {}
    for worker in workers:
        [lease] = db.execute("SELECT * FROM awp.claim_tasks(%s, %s, 1)", list(worker)).fetchall()
        held[worker] = lease
    assert db.execute("SELECT count(*) AS n FROM awp.dispatches WHERE status = 'pending'").fetchone()["n"] == 0
    with db.transaction():  # awp._fairness_order is a cursor: read it within one transaction
        cursor = db.execute("SELECT awp._fairness_order('{mock}') AS c").fetchone()["c"]
        order = [r["run_id"] for r in db.execute(sql.SQL("FETCH ALL FROM {}").format(sql.Identifier(cursor)))]
    first = order[0]  # where the refills would go first; held elsewhere below
    items = [
        {
            "worker_id": w[0],
            "session_token": w[1],
            "dispatch_id": lease["dispatch_id"],
            "lease_token": lease["lease_token"],
            "result": {"kind": "success"},
            "slots": 1,
            "claim_seq": None,
        }
        for w, lease in held.items()
        if lease["run_id"] != first
    ]
    assert len(items) >= 2
    with connect(db_dsn) as holder, connect(db_dsn) as grouper, holder.transaction():
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [first])
        with grouper.transaction():  # the group path itself, not the item loop complete_and_claim_many falls to
            rows = grouper.execute(
                "SELECT g.item, (g.lease).run_id FROM awp._complete_and_refill_group(%s) g ORDER BY g.item",
                [json.dumps(items)],
            ).fetchall()
    assert [r["item"] for r in rows] == list(range(1, len(items) + 1)), "every item refilled"
    assert first not in {r["run_id"] for r in rows}, "no refill from the run held elsewhere"
    assert db.execute("SELECT * FROM awp.check_invariants()").fetchall() == []
