"""The lock protocol, observed directly: what a call holds while it waits, shown with ``pg_blocking_pids`` and
``pg_locks`` instead of inferred from timing.

- complete_task takes the run's advisory lock, then the run row, then the dispatch row (Run before Dispatch,
  as everywhere): while it waits for the run it holds the advisory lock and not the dispatch;
- every transaction that adds pending dispatches queues on one advisory lock before it reads the budget, so
  two of them can never both spend the last unit of ``dispatch_limit``.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sync_support import connect, in_thread, wait_blocked

from awp_testing.cluster import DictConnection, one


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


def group_item(worker: tuple[str, str], lease: dict[str, Any]) -> dict[str, Any]:
    """An item of awp.complete_and_claim_many: a success of the worker's lease, one slot asked back."""
    return {
        "worker_id": worker[0],
        "session_token": worker[1],
        "dispatch_id": lease["dispatch_id"],
        "lease_token": lease["lease_token"],
        "result": {"kind": "success"},
        "slots": 1,
        "claim_seq": None,
    }


def assert_waits_on_advisory_lock(db: DictConnection, first: DictConnection, second: DictConnection, call: Any) -> None:
    """``second``'s call (running in ``call``) waits for ``first``, on an advisory lock (the budget's)."""
    assert wait_blocked(db, second.info.backend_pid, call) == [first.info.backend_pid]
    waiting = db.execute("SELECT locktype FROM pg_locks WHERE pid = %s AND NOT granted", [second.info.backend_pid])
    assert waiting.fetchall() == [{"locktype": "advisory"}], "it waits for the budget's advisory lock"


def test_dispatch_creators_queue_on_the_budget_lock_and_never_overspend(db, db_dsn):
    db.execute("SELECT awp.configure(dispatch_limit => 1)")
    register(db, "w", 4)
    with connect(db_dsn) as first, connect(db_dsn) as second:
        with first.transaction():
            first_run = start(first, "first")  # a run start creates its dispatch under the budget lock
            call = in_thread(lambda: start(second, "second"))
            assert_waits_on_advisory_lock(db, first, second, call)
        second_run = call.result()
    live = db.execute(
        "SELECT run_id FROM awp.dispatches WHERE status IN ('pending', 'leased') ORDER BY created_at"
    ).fetchall()
    assert [x["run_id"] for x in live] == [first_run], "dispatch_limit 1: the second run got nothing"
    assert db.execute("SELECT status FROM awp.runs WHERE run_id = %s", [second_run]).fetchone()["status"] == "pending"
    assert db.execute("SELECT * FROM awp.check_invariants()").fetchall() == []


def test_a_coordinator_pass_holds_the_budget_lock_against_a_run_start(db, db_dsn):
    """The pass's dispatch creation (awp._create_dispatches) takes the same budget lock as a run start
    (awp._dispatch_new_run): a start during a pass that spent the last unit waits, then gets nothing."""
    db.execute("SELECT awp.configure(dispatch_limit => 1)")
    waiting_run = start(db, "before-any-worker")  # no worker yet: its task stays ready, nothing dispatched
    assert db.execute("SELECT count(*) AS n FROM awp.dispatches").fetchone()["n"] == 0
    register(db, "w", 4)
    with connect(db_dsn) as first, connect(db_dsn) as second:
        with first.transaction():
            first.execute("SELECT awp.coordinator_tick()")  # dispatches the waiting task, the last unit
            call = in_thread(lambda: start(second, "during-the-pass"))
            assert_waits_on_advisory_lock(db, first, second, call)
        late_run = call.result()
    live = db.execute("SELECT run_id FROM awp.dispatches WHERE status IN ('pending', 'leased')").fetchall()
    assert [x["run_id"] for x in live] == [waiting_run], "dispatch_limit 1: the run started during the pass got none"
    assert db.execute("SELECT status FROM awp.runs WHERE run_id = %s", [late_run]).fetchone()["status"] == "pending"
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
    items = [group_item(w, lease) for w, lease in held.items() if lease["run_id"] != first]
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


@pytest.mark.parametrize("route", ["complete_task", "complete_and_claim", "group"])
def test_a_completion_carrying_output_takes_its_run_lock_before_the_runs_counter(db, db_dsn, route):
    """Every completion that writes the output riding on it (its ``live_output``) takes its run's advisory lock
    before the run's counter row (awp.run_outputs), the one lock a lone progress write takes (docs/progress.md,
    Locks): while a progress write of the run holds the counter, the completion waits for it holding the run's
    advisory lock. One order for every completion: one that took the counter first could wait for the run's lock
    held by another that waits for the counter."""
    tasks = [{"key": f"t{i}", "executor": "mock"} for i in range(4)]
    db.execute(
        "SELECT * FROM awp.create_workflow_version(%s)", [json.dumps({"id": "out", "concurrency": 2, "tasks": tasks})]
    )
    run_id = one(db, "SELECT awp.start_run('out') AS id")["id"]
    workers = [register(db, f"w{i}") for i in range(2)]
    db.execute("SELECT awp.coordinator_tick()")
    leases = [db.execute("SELECT * FROM awp.claim_tasks(%s, %s, 1)", list(w)).fetchone() for w in workers]
    db.execute(  # the run's counter row exists (a write of one lease)
        "SELECT awp.report_progress(%s, %s, %s, %s, p_logs => '{first}', p_offset => 0)",
        [*workers[1], leases[1]["dispatch_id"], leases[1]["lease_token"]],
    )
    items = [
        {**group_item(w, lease), "live_output": [{"logs": [f"last of {n}"]}]}
        for n, (w, lease) in enumerate(zip(workers, leases, strict=True))
    ]
    args = [*workers[0], leases[0]["dispatch_id"], leases[0]["lease_token"], json.dumps({"kind": "success"})]
    live = json.dumps(items[0]["live_output"])
    calls = {
        "complete_task": ("SELECT awp.complete_task(%s, %s, %s, %s, %s, %s) IS NOT NULL AS ok", [*args, live]),
        "complete_and_claim": (
            "SELECT count(*) >= 0 AS ok FROM awp.complete_and_claim(%s, %s, %s, %s, %s, 0, NULL, %s)",
            [*args, live],
        ),
        "group": ("SELECT bool_and(g.error IS NULL) AS ok FROM awp.complete_and_claim_many(%s) g", [json.dumps(items)]),
    }
    statement, params = calls[route]
    with connect(db_dsn) as holder, connect(db_dsn) as completer:
        with holder.transaction():
            holder.execute("SELECT 1 FROM awp.run_outputs WHERE run_id = %s FOR UPDATE", [run_id])
            call = in_thread(lambda: one(completer, statement, params)["ok"])
            pid = completer.info.backend_pid
            assert wait_blocked(db, pid, call) == [holder.info.backend_pid], "it waits for the run's counter"
            held = db.execute(
                "SELECT locktype, granted FROM pg_locks WHERE pid = %s AND locktype = 'advisory'", [pid]
            ).fetchall()
            assert held == [{"locktype": "advisory", "granted": True}], "holding the run's advisory lock"
        assert call.result() is True
    got = one(db, "SELECT awp.task_logs(%s, %s)->'logs' AS logs", [run_id, leases[0]["task_key"]])["logs"]
    assert got == ["last of 0"]
    assert db.execute("SELECT * FROM awp.check_invariants()").fetchall() == []


# ---- dynamic workflows (docs/dynamic.md; docs/architecture.md, Lock order: a parent run before its children) -----


def _child_workflows(c: DictConnection) -> str:
    """A parent run whose task "sub" has started a child run of "lo-kid" (one mock task); returns the parent."""
    for definition in (
        {"id": "lo-kid", "tasks": [{"key": "k", "executor": "mock"}]},
        {"id": "lo-parent", "tasks": [{"key": "sub", "executor": "workflow", "input": {"workflow_id": "lo-kid"}}]},
    ):
        c.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps(definition)])
    return one(c, "SELECT awp.start_run('lo-parent') AS id")["id"]


def test_a_child_run_ends_without_waiting_for_its_parent(db, db_dsn):
    parent = _child_workflows(db)
    child = one(db, "SELECT child_run_id FROM awp.run_tasks(%s) WHERE task_key = 'sub'", [parent])["child_run_id"]
    worker = register(db, "w")
    db.execute("SELECT awp.coordinator_tick()")
    [lease] = db.execute("SELECT * FROM awp.claim_tasks(%s, %s, 1)", list(worker)).fetchall()
    assert lease["run_id"] == child
    with connect(db_dsn) as holder, connect(db_dsn) as completer, holder.transaction():
        holder.execute("SELECT 1 FROM awp.runs WHERE run_id = %s FOR UPDATE", [parent])
        ok = one(
            completer,
            "SELECT awp.complete_task(%s, %s, %s, %s, %s) AS ok",
            [*worker, lease["dispatch_id"], lease["lease_token"], json.dumps({"kind": "success"})],
        )["ok"]
        assert ok is True, "the child's last completion went through while its parent's row was held"
        status = one(completer, "SELECT status FROM awp.runs WHERE run_id = %s", [child])["status"]
        assert status == "succeeded"
    db.execute("SELECT awp.coordinator_tick()")  # the pass settles the parent's task under the parent's lock
    assert one(db, "SELECT status FROM awp.runs WHERE run_id = %s", [parent])["status"] == "succeeded"
    assert db.execute("SELECT * FROM awp.check_invariants()").fetchall() == []


def test_a_parents_cancel_locks_the_parent_before_its_child(db, db_dsn):
    parent = _child_workflows(db)
    child = one(db, "SELECT child_run_id FROM awp.run_tasks(%s) WHERE task_key = 'sub'", [parent])["child_run_id"]
    with connect(db_dsn) as holder, connect(db_dsn) as canceler, connect(db_dsn) as probe:
        with holder.transaction():
            holder.execute("SELECT 1 FROM awp.runs WHERE run_id = %s FOR UPDATE", [child])
            call = in_thread(lambda: canceler.execute("SELECT * FROM awp.request_cancel(%s)", [parent]).fetchall())
            assert wait_blocked(db, canceler.info.backend_pid, call) == [holder.info.backend_pid], "waits for the child"
            with pytest.raises(psycopg.errors.LockNotAvailable):  # holding its parent meanwhile
                probe.execute("SELECT 1 FROM awp.runs WHERE run_id = %s FOR UPDATE NOWAIT", [parent])
        call.result()
    statuses = db.execute("SELECT status FROM awp.runs WHERE run_id = ANY(%s)", [[parent, child]]).fetchall()
    assert [s["status"] for s in statuses] == ["canceled", "canceled"]
    assert db.execute("SELECT * FROM awp.check_invariants()").fetchall() == []


def test_a_for_each_expands_under_its_own_run_alone(db, db_dsn):
    definition = {
        "id": "lo-fan",
        "tasks": [
            {"key": "split", "executor": "mock"},
            {"key": "each", "executor": "mock", "depends_on": ["split"], "for_each": "split"},
        ],
    }
    db.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps(definition)])
    run_id = one(db, "SELECT awp.start_run('lo-fan') AS id")["id"]
    other = start(db, "lo-other")
    worker = register(db, "w", 4)
    db.execute("SELECT awp.coordinator_tick()")
    leases = db.execute("SELECT * FROM awp.claim_tasks(%s, %s, 4)", list(worker)).fetchall()
    split = next(x for x in leases if x["task_key"] == "split")
    # Another run held: the expansion neither needs nor waits for it.
    with connect(db_dsn) as holder, connect(db_dsn) as completer, holder.transaction():
        holder.execute("SELECT 1 FROM awp.runs WHERE run_id = %s FOR UPDATE", [other])
        result = json.dumps({"kind": "success", "output": list(range(200))})
        completer.execute(
            "SELECT * FROM awp.complete_and_claim(%s, %s, %s, %s, %s, 1)",
            [*worker, split["dispatch_id"], split["lease_token"], result],
        ).fetchall()
        n = one(completer, "SELECT item_count FROM awp.tasks WHERE run_id = %s AND task_key = 'each'", [run_id])
        assert n["item_count"] == 200
    assert db.execute("SELECT * FROM awp.check_invariants(ARRAY[%s])", [run_id]).fetchall() == []
