"""The completion paths write their dispatches with one MERGE each (the completed ones updated, the refills inserted)
that joins its few rows to ``awp.dispatches`` by primary key: ``awp._complete_and_refill_group`` (the group path,
db/functions/complete_task.sql) and ``awp._lease_refill`` (the hot path's completion with its refill,
db/functions/claim_tasks.sql).

With statistics gathered while the table held a handful of rows, the planner preferred to scan all of it (hashed,
materialized, or filtered row by row), and the plan cache kept that plan while the table grew: measured, +30% per
completion at 2,400 dispatches; the hot path's UPDATE of its two tasks, joined to a VALUES list, scanned every task.
Both MERGEs name the ids on the table as well, and they and that UPDATE are planned with enable_seqscan off (set
around the statements only: on a whole function it forced the scan of the settings row into plans that were
JIT-compiled on every call); so are the group path's read and UPDATE of its tasks by ctid. Checked here on the
plans themselves (auto_explain, nested statements), right after such statistics, so a slow machine passes and a
plan that scans the table does not."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from awp_testing.cluster import one

Setup = tuple[psycopg.Connection[Any], list[str], list[dict[str, Any]]]


def explaining(dsn: str, generic: bool = True) -> Iterator[tuple[psycopg.Connection[Any], list[str]]]:
    """A new session whose auto_explain reports every statement's plan, nested ones included; with ``generic``, it
    keeps the generic plans (as a busy session does)."""
    with psycopg.connect(dsn, autocommit=True) as call:
        notices: list[str] = []
        call.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        call.execute("LOAD 'auto_explain'")
        for setting, value in (("log_min_duration", "0"), ("log_nested_statements", "on"), ("log_level", "notice")):
            call.execute(f"SET auto_explain.{setting} = {value}")
        if generic:
            call.execute("SET plan_cache_mode = force_generic_plan")
        notices.clear()
        yield call, notices


@pytest.fixture
def tiny(db_dsn: str) -> Iterator[Setup]:
    """Two workers of one slot, each holding a lease of a fresh run, the statistics of awp.dispatches and awp.tasks
    gathered while they held a few rows, and a new session (no plan cached yet: every statement of the call under
    test is planned inside it) whose auto_explain reports the plan of every statement, nested ones included."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(
            "TRUNCATE awp.events, awp.dispatches, awp.tasks, awp.runs, awp.signals, awp.task_output,"
            " awp.task_progress, awp.run_outputs, awp.ready_queue, awp.workers CASCADE"
        )
        tasks = [{"key": f"t{i:03d}", "executor": "mock"} for i in range(20)]
        c.execute(
            "SELECT * FROM awp.create_workflow_version(%s)", [json.dumps({"id": "p", "concurrency": 2, "tasks": tasks})]
        )
        c.execute("SELECT awp.start_run('p')")
        workers = [
            one(c, "SELECT worker_id, session_token FROM awp.register_worker(%s, '{mock}', 1)", [n])
            for n in ("w1", "w2")
        ]
        c.execute("SELECT awp.coordinator_tick()")
        leases = []
        for worker_id, token in workers:
            lease = one(c, "SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 1)", [worker_id, token])
            leases.append(
                {"worker_id": worker_id, "session_token": token, "dispatch_id": lease[0], "lease_token": lease[1]}
            )
        c.execute("ANALYZE awp.dispatches")
        c.execute("ANALYZE awp.tasks")
    for call, notices in explaining(db_dsn, generic=False):
        yield call, notices, leases


def merge_plan(notices: list[str], target: str) -> str:
    """The plan (without its query text) of the one MERGE INTO awp.dispatches AS ``target`` reported."""
    plans = [n for n in notices if f"MERGE INTO awp.dispatches {target}" in n]
    assert len(plans) == 1, f"expected the plan of one MERGE INTO awp.dispatches {target}, got {len(plans)}"
    plan = plans[0][plans[0].index(f"\nMerge on dispatches {target}") :]
    return plan


def assert_probes(plan: str, table: str = "dispatches", columns: tuple[str, ...] = ("dispatch_id",)) -> None:
    """``table`` is read only through an index condition on ``columns`` (awp.dispatches: the ids): no scan of the
    whole table, whether sequential or along an index."""
    lines = plan.splitlines()
    # The table, or one of its partitions (awp.dispatches and awp.tasks are partitioned: migration 0023).
    scans = [n for n, line in enumerate(lines) if re.search(rf" on {table}(_\w+)? ", line) and "Scan" in line]
    assert scans, plan
    for n in scans:
        assert "Seq Scan" not in lines[n], plan
        conditions = [line for line in lines[n + 1 : n + 3] if "Index Cond:" in line or "Recheck Cond:" in line]
        assert any(all(c in line for c in columns) for line in conditions), plan


def tasks_update_plan(notices: list[str]) -> str:
    """The plan of the hot path's one UPDATE of awp.tasks (the completed and the refilled task, a VALUES list)."""
    plans = [n for n in notices if "UPDATE awp.tasks y" in n and "FROM (VALUES" in n]
    assert len(plans) == 1, f"expected the plan of the hot path's tasks UPDATE, got {len(plans)}"
    return plans[0][plans[0].index("\nUpdate on tasks y") :]


def assert_not_compiled(notices: list[str]) -> None:
    """No statement of the call was planned so expensive that PostgreSQL JIT-compiled it (a scan forced against a
    planner setting costs more than jit_above_cost: compiled on every call, milliseconds each)."""
    compiled = [n.split("\n", 2)[1] for n in notices if "\nJIT:" in n]
    assert compiled == [], compiled


def test_the_group_path_probes_each_dispatch(tiny: Setup) -> None:
    call, notices, leases = tiny
    items = [{**lease, "result": {"kind": "success"}, "slots": 1, "claim_seq": None} for lease in leases]
    rows = call.execute(
        "SELECT g.item, g.error, (g.lease).dispatch_id FROM awp.complete_and_claim_many(%s) g", [json.dumps(items)]
    ).fetchall()
    assert [(r[0], r[1], r[2] is not None) for r in sorted(rows)] == [(1, None, True), (2, None, True)]
    assert any("awp._complete_and_refill_group" in n for n in notices), "the group path did not run"
    assert_probes(merge_plan(notices, "d"))
    assert_not_compiled(notices)


def test_the_group_path_reads_and_writes_its_tasks_by_tid(tiny: Setup) -> None:
    """The group path's read of the completed tasks and its one UPDATE of the completed and refilled tasks name
    the rows by ctid, held in variables (parameters of the cached generic plans): planned while the table was small,
    both scanned every task (PostgreSQL CPU per task grew from 1.8 to 2.8 ms over four 1,000-task runs); planned
    with enable_seqscan off, both are TID scans."""
    call, notices, leases = tiny
    items = [{**lease, "result": {"kind": "success"}, "slots": 1, "claim_seq": None} for lease in leases]
    call.execute("SELECT * FROM awp.complete_and_claim_many(%s)", [json.dumps(items)]).fetchall()
    plans = [n for n in notices if "FROM awp.tasks y" in n and "y.ctid = ANY (v_ctid)" in n]
    plans += [n for n in notices if "UPDATE awp.tasks y" in n and "y.ctid = ANY (v_ctid || v_ftid)" in n]
    assert len(plans) == 2, f"expected the plans of the group path's two statements on tasks, got {len(plans)}"
    for plan in plans:  # on each partition of awp.tasks (migration 0023)
        assert re.search(r"Tid Scan on tasks\w* y", plan) and "Seq Scan" not in plan, plan
    assert_not_compiled(notices)


def hot_path_call(tiny: Setup) -> list[str]:
    """The first worker's lease completed with claim on complete (the hot path: a refill leased back); the plans."""
    call, notices, leases = tiny
    lease = leases[0]
    args = [lease["worker_id"], lease["session_token"], lease["dispatch_id"], lease["lease_token"]]
    row = one(
        call, "SELECT dispatch_id FROM awp.complete_and_claim(%s, %s, %s, %s, %s, 1)", [*args, '{"kind": "success"}']
    )
    assert row[0] is not None and row[0] != lease["dispatch_id"]
    return notices


def test_the_hot_path_probes_the_completed_dispatch(tiny: Setup) -> None:
    notices = hot_path_call(tiny)
    assert_probes(merge_plan(notices, "x"))
    assert_not_compiled(notices)


def test_the_hot_path_probes_the_completed_and_the_refilled_task(tiny: Setup) -> None:
    """The UPDATE of the completed and the refilled task (awp._lease_refill, joined to a VALUES list) was a hash
    join over a scan of every task while the table was small (1,200 rows scanned per completion in a fresh
    database); planned with enable_seqscan off, it probes awp.tasks by primary key."""
    notices = hot_path_call(tiny)
    assert_probes(tasks_update_plan(notices), "tasks", ("run_id", "task_key"))


def assert_executed_probes(plan: str, table: str, columns: tuple[str, ...]) -> None:
    """Every scan of ``table`` (or of one of its partitions) that ran (auto_explain.log_analyze) is a probe: an index
    condition on ``columns``. A partition pruned at run time ("never executed") may be planned as a scan: it is
    the empty one of a range not yet reached."""
    lines = plan.splitlines()
    scans = [n for n, line in enumerate(lines) if re.search(rf" on {table}(_\w+)? ", line) and "Scan" in line]
    ran = [n for n in scans if "never executed" not in lines[n]]
    assert ran, plan
    for n in ran:
        assert "Seq Scan" not in lines[n], plan
        conditions = [line for line in lines[n + 1 : n + 3] if "Index Cond:" in line or "Recheck Cond:" in line]
        assert any(all(c in line for c in columns) for line in conditions), plan


def analyzed_plans(call: psycopg.Connection[Any], notices: list[str], statement: str, args: list[Any]) -> list[str]:
    """The plans, as they ran (with the rows each node gave), of every statement ``statement`` ran."""
    call.execute("SET auto_explain.log_analyze = on")
    call.execute("SET auto_explain.log_timing = off")
    notices.clear()
    call.execute(statement, args).fetchall()
    return list(notices)


def test_a_claim_reads_each_new_lease_by_key(tiny: Setup) -> None:
    """The claim's read of each lease it hands out (its dispatch, task and run) is three key probes: as a join, the
    generic plan merged the dispatch with every run and every task of its run (2.4 ms per lease at 1,000 runs;
    docs/performance.md, Joins over partitions)."""
    call, notices, _ = tiny
    worker_id, token = one(call, "SELECT worker_id, session_token FROM awp.register_worker('w3', '{mock}', 2)")
    call.execute("SELECT awp.start_run('p')")
    call.execute("SELECT awp.coordinator_tick()")
    plans = analyzed_plans(call, notices, "SELECT * FROM awp.claim_tasks(%s, %s, 2)", [worker_id, token])
    reads = [n for n in plans if "d.executor_kind, t.action" in n and "FROM awp.dispatches d" in n]
    assert reads, "the claim did not read a lease"
    for plan in reads:
        assert_executed_probes(plan, "tasks", ("run_id", "task_key"))
        assert_executed_probes(plan, "runs", ("run_id",))
        assert_executed_probes(plan, "dispatches", ("dispatch_id",))


def test_a_heartbeat_finds_each_lease_and_its_run_by_key(tiny: Setup) -> None:
    """The heartbeat's renewals and its answers find each listed lease by its id and its run by key: as joins, the
    generic plan read every leased dispatch and every run (1,140 buffers per heartbeat of 16 leases at 1,000 runs)."""
    call, notices, leases = tiny
    lease = leases[0]
    listed = json.dumps([{"dispatch_id": lease["dispatch_id"], "lease_token": lease["lease_token"]}])
    plans = analyzed_plans(
        call, notices, "SELECT * FROM awp.heartbeat(%s, %s, %s)", [lease["worker_id"], lease["session_token"], listed]
    )
    renewals = [n for n in plans if "renewable AS" in n]
    answers = [n for n in plans if "SELECT e.id," in n and "'renewed'" in n]
    assert len(renewals) == 1 and len(answers) == 1, "expected the plans of the renewals and of the answers"
    for plan in renewals + answers:
        assert_executed_probes(plan, "dispatches", ("dispatch_id",))
        assert_executed_probes(plan, "runs", ("run_id",))
    status = call.execute(
        "SELECT status FROM awp.heartbeat(%s, %s, %s)", [lease["worker_id"], lease["session_token"], listed]
    ).fetchall()
    assert status == [("renewed",)]


def test_a_completion_checks_its_attempt_by_key(tiny: Setup) -> None:
    """awp._complete_task's check that the attempt is still the task's current one reads the attempt and its task by
    key: as a join, the generic plan read every running task (186 buffers per completion at 1,000 runs)."""
    call, notices, leases = tiny
    lease = leases[0]
    args = [lease["worker_id"], lease["session_token"], lease["dispatch_id"], lease["lease_token"]]
    plans = analyzed_plans(call, notices, 'SELECT awp.complete_task(%s, %s, %s, %s, \'{"kind": "success"}\')', args)
    checks = [n for n in plans if "FROM awp.attempts a" in n]
    assert len(checks) == 1, "expected the plan of the attempt check"
    assert_executed_probes(checks[0], "dispatches", ("dispatch_id",))
    assert_executed_probes(checks[0], "tasks", ("run_id", "task_key"))
    assert one(call, "SELECT status FROM awp.dispatches WHERE dispatch_id = %s", [lease["dispatch_id"]]) == (
        "completed",
    )


def test_a_progress_write_reads_its_run_counter_and_its_attempt_by_key(tiny: Setup) -> None:
    """A progress write locks its run's counter and reads what its attempt already has (its lines, its counters row)
    by key, in both forms: one write (awp._write_progress: the common write in one statement, and the general read)
    and a batch of two (awp._write_progress_batch). Planned while those tables were empty, the generic plans scanned the
    whole partition of the run's lines for every write (docs/progress.md, Cost on the hot path)."""
    call, notices, leases = tiny
    for table in ("task_output", "task_progress", "run_outputs"):
        call.execute(f"ANALYZE awp.{table}")  # empty: the statistics that made the scans look cheapest
    worker_id, token = one(call, "SELECT worker_id, session_token FROM awp.register_worker('w3', '{mock}', 2)")
    call.execute("SELECT awp.start_run('p')")
    call.execute("SELECT awp.coordinator_tick()")
    two = call.execute("SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 2)", [worker_id, token]).fetchall()
    assert len(two) == 2
    batch = json.dumps([{"dispatch_id": d, "lease_token": t, "logs": ["x"], "offset": 0} for d, t in two])
    statement = "SELECT * FROM awp.report_progress_many(%s, %s, %s)"
    plans = analyzed_plans(call, notices, statement, [worker_id, token, batch])
    reads = [n for n in plans if "FROM awp.task_output o" in n]
    counters = [n for n in plans if "UPDATE awp.run_outputs o SET last_seq = o.last_seq + v_n" in n]
    assert len(reads) == 1 and len(counters) == 1, "expected the batch's read of its attempts and its counter"
    assert_executed_probes(reads[0], "task_output", ("run_id", "task_key", "attempt"))
    assert_executed_probes(reads[0], "task_progress", ("dispatch_id",))
    assert_executed_probes(counters[0], "run_outputs", ("run_id",))

    b = leases[1]
    one_write = [b["worker_id"], b["session_token"], b["dispatch_id"], b["lease_token"]]
    plans = analyzed_plans(
        call, notices, "SELECT awp.report_progress(%s, %s, %s, %s, p_logs => '{y}', p_offset => 0)", one_write
    )
    common = [n for n in plans if "INSERT INTO awp.task_output" in n and "FROM awp.task_output o" in n]
    counters = [n for n in plans if "UPDATE awp.run_outputs o SET last_seq = o.last_seq + v_count" in n]
    assert len(common) == 1 and len(counters) == 1, "expected the write's counter and its write in one statement"
    assert_executed_probes(common[0], "task_output", ("run_id", "task_key", "attempt"))
    assert_executed_probes(common[0], "task_progress", ("dispatch_id",))
    assert_executed_probes(counters[0], "run_outputs", ("run_id",))

    plans = analyzed_plans(call, notices, "SELECT awp.report_progress(%s, %s, %s, %s, '{\"pct\": 50}')", one_write)
    general = [n for n in plans if "LEFT JOIN awp.task_progress t" in n]
    assert len(general) == 1, "expected the general read of what the attempt has"
    assert_executed_probes(general[0], "task_progress", ("dispatch_id",))
    assert_executed_probes(general[0], "task_output", ("run_id", "task_key", "attempt"))
    logs = one(
        call,
        "SELECT awp.task_logs(r.run_id, t.task_key) FROM awp.dispatches t JOIN awp.runs r USING (run_id)"
        " WHERE t.dispatch_id = %s",
        [b["dispatch_id"]],
    )[0]
    assert (logs["logs"], logs["progress"]) == (["y"], {"pct": 50})


def test_the_group_path_writes_its_items_output_reading_each_attempt_by_key(tiny: Setup) -> None:
    """A group of completions carrying their last lines is settled by the group path, which writes the lines itself
    (awp._write_group_output: no call of awp._write_progress per write) and reads what each attempt already has by
    key: its rows of awp.task_output and its counters row (docs/progress.md, Cost on the hot path)."""
    call, notices, leases = tiny
    for table in ("task_output", "task_progress", "run_outputs"):
        call.execute(f"ANALYZE awp.{table}")  # empty: the statistics that made the scans look cheapest
    items = [
        {**lease, "result": {"kind": "success"}, "slots": 1, "claim_seq": None, "live_output": [{"logs": [f"l{n}"]}]}
        for n, lease in enumerate(leases)
    ]
    plans = analyzed_plans(
        call, notices, "SELECT g.item, g.error FROM awp.complete_and_claim_many(%s) g", [json.dumps(items)]
    )
    assert any("awp._write_group_output" in n for n in plans), "the group path did not write the output"
    assert not any("last_seq = o.last_seq + v_count" in n for n in plans), "a write went through awp._write_progress"
    reads = [n for n in plans if "FROM awp.task_output o" in n and "o.attempt = v_att" in n]
    assert len(reads) == 2, "expected one read of each attempt"
    for plan in reads:
        assert_executed_probes(plan, "task_output", ("run_id", "task_key", "attempt"))
        assert_executed_probes(plan, "task_progress", ("dispatch_id",))
    assert_not_compiled(plans)
    logs = call.execute(
        "SELECT awp.task_logs(d.run_id, d.task_key)->'logs' FROM awp.dispatches d WHERE d.dispatch_id = ANY(%s)",
        [[lease["dispatch_id"] for lease in leases]],
    ).fetchall()
    assert sorted(r[0] for r in logs) == [["l0"], ["l1"]]


def test_a_completion_checks_for_waiting_dispatches_from_the_pending_ones(tiny: Setup) -> None:
    """Before it leases its own refill, a completion checks that no pending dispatch of the worker's kinds waits for
    a claim (awp._lease_refill, through awp._pending_waits). Written as an EXISTS over awp._claim_candidates, the
    generic plan read every run and joined the pending dispatches to them (104 buffers per completion at 1,000 live
    runs); now the pending dispatches drive it (their partial index) and each probes its run by key."""
    call, notices, leases = tiny
    call.execute("SELECT awp.register_worker('w3', '{mock}', 2)")
    call.execute("SELECT awp.start_run('p')")
    call.execute("SELECT awp.coordinator_tick()")  # dispatches for w3's free slots: pending, waiting for a claim
    assert one(call, "SELECT count(*) FROM awp.dispatches WHERE status = 'pending'")[0] > 0
    call.execute("ANALYZE awp.runs")  # while there are few
    lease = leases[0]
    args = [lease["worker_id"], lease["session_token"], lease["dispatch_id"], lease["lease_token"]]
    statement = 'SELECT dispatch_id FROM awp.complete_and_claim(%s, %s, %s, %s, \'{"kind": "success"}\', 1)'
    plans = analyzed_plans(call, notices, statement, args)
    checks = [n for n in plans if "k.executor_kind = ANY (p_kinds)" in n]
    assert len(checks) == 1, "expected the plan of the check for waiting dispatches"
    assert_executed_probes(checks[0], "runs", ("run_id",))
    ran = [line for line in checks[0].splitlines() if " on dispatches" in line and "never executed" not in line]
    assert ran and not any("Seq Scan" in line for line in ran), checks[0]


def test_the_ready_queue_is_counted_down_by_its_primary_key(tiny: Setup) -> None:
    """A task leaving ready counts its run's awp.ready_queue row down (the trigger of db/functions/_ready_queue.sql)
    by the row's primary key, run first: with equalities on all three key columns, a plan made while the queue had
    no statistics read the kind's whole fairness order through ready_queue_order_idx (63 buffers at 1,000 runs)."""
    notices = hot_path_call(tiny)
    plans = [n for n in notices if "SET ready_tasks = q.ready_tasks - 1" in n]
    assert plans, "expected the plan of the ready queue's count-down"
    for plan in plans:
        assert "ready_queue_pkey" in plan and "ready_queue_order_idx" not in plan, plan


def test_the_hot_path_reads_its_runs_by_key(tiny: Setup) -> None:
    """The hot path locks the completed task's run (awp._complete_and_refill) and reads the run it refills from
    (awp._lease_refill) by the run's key, then checks their state. With the state in the WHERE (`status =
    'running'`), a plan made while the runs were few read every live run through runs_live_idx (about 40 buffers per
    completion at 3,000 live runs)."""
    call, notices, _ = tiny
    call.execute("SELECT awp.start_run('p')")  # a second live run (the plans cover several)
    call.execute("ANALYZE awp.runs")  # while there are few
    notices = hot_path_call(tiny)
    plans = [n for n in notices if "SELECT x.unfinished_tasks = 1" in n]
    plans += [n for n in notices if "SELECT x.status, x.concurrency, x.workflow_id, x.workflow_version, x.input" in n]
    assert len(plans) == 2, "expected the plans of the completed run's lock and of the refill's run read"
    for plan in plans:
        assert_probes(plan, "runs", ("run_id",))


def settle_after_small_runs(
    dsn: str, hold_task: str | None = None
) -> tuple[dict[str, str], tuple[str, str, str, str] | None]:
    """Runs ``wide`` (60 tasks), ``fan`` (``split``, then ``each`` for_each over its 60 items) and 40 one-task runs,
    all completed by one worker but, when ``hold_task`` names a task, the first lease of it (returned as (worker,
    session token, dispatch, lease token) with the run ids); then the statistics of those tables (mostly small
    runs)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("TRUNCATE awp.events, awp.dispatches, awp.tasks, awp.runs, awp.ready_queue, awp.workers CASCADE")
        split = {"key": "split", "executor": "mock"}
        each = {"key": "each", "executor": "mock", "depends_on": ["split"], "for_each": "split", "max_items": 60}
        for wid, tasks in (
            ("one", [{"key": "t", "executor": "mock"}]),
            ("wide", [{"key": f"t{i:03d}", "executor": "mock"} for i in range(60)]),
            ("fan", [split, each]),
        ):
            c.execute(
                "SELECT * FROM awp.create_workflow_version(%s)",
                [json.dumps({"id": wid, "concurrency": 60, "tasks": tasks})],
            )
        worker_id, token = one(c, "SELECT worker_id, session_token FROM awp.register_worker('w', '{mock}', 100)")
        c.execute("SELECT awp.start_runs('one', 1, (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, 40)))")
        runs = {wid: one(c, "SELECT awp.start_run(%s)", [wid])[0] for wid in ("wide", "fan")}
        held = None
        c.execute("SELECT awp.coordinator_tick()")
        while leases := c.execute(
            "SELECT dispatch_id, lease_token, task_key FROM awp.claim_tasks(%s, %s, %s)",
            [worker_id, token, 99 if held else 100],
        ).fetchall():
            for dispatch_id, lease_token, task_key in leases:
                if held is None and hold_task is not None and task_key.startswith(hold_task):
                    held = (worker_id, token, dispatch_id, lease_token)
                    continue
                output = list(range(60)) if task_key == "split" else 1
                c.execute(
                    "SELECT awp.complete_task(%s, %s, %s, %s, %s)",
                    [worker_id, token, dispatch_id, lease_token, json.dumps({"kind": "success", "output": output})],
                )
            c.execute("SELECT awp.coordinator_tick()")
        c.execute("ANALYZE awp.tasks, awp.dispatches, awp.runs")
    return runs, held


def test_a_run_s_output_reads_each_leaf_s_attempt_by_key(db_dsn: str) -> None:
    """A run that succeeds stores its output: the outputs of its leaf tasks' succeeded attempts (awp._run_output).
    Joined to the attempts, with the statistics of many small runs the generic plan read the run's attempts once and
    compared each leaf with all of them (a run of 5,000 leaves took 0.85 s to settle, in a database with history);
    each leaf's attempt is now a probe of its key (run, task, attempt)."""
    runs, _ = settle_after_small_runs(db_dsn)
    for call, notices in explaining(db_dsn):
        assert one(call, "SELECT status FROM awp.runs WHERE run_id = %s", [runs["wide"]])[0] == "succeeded"
        plans = analyzed_plans(call, notices, "SELECT * FROM awp._run_output(%s)", [runs["wide"]])
    reads = [n for n in plans if "WITH leaves AS" in n]
    assert len(reads) == 1, "expected the plan of the run output's read"
    assert_executed_probes(reads[0], "dispatches", ("run_id", "task_key", "attempt"))


def test_a_for_each_collects_each_instance_s_attempt_by_key(db_dsn: str) -> None:
    """The last instance of a for_each task to succeed settles the mapped task with the list of its instances'
    outputs (awp._resolve_run, docs/dynamic.md): each instance's attempt is a probe of its key, as in
    awp._run_output (a join took 0.7 s for 5,000 instances)."""
    runs, held = settle_after_small_runs(db_dsn, hold_task="each")
    assert held is not None
    for call, notices in explaining(db_dsn):
        plans = analyzed_plans(
            call,
            notices,
            'SELECT awp.complete_task(%s, %s, %s, %s, \'{"kind": "success", "output": 1}\')',
            list(held),
        )
        assert one(call, "SELECT status FROM awp.runs WHERE run_id = %s", [runs["fan"]])[0] == "succeeded"
    collects = [n for n in plans if "jsonb_agg(coalesce(a.output, 'null'::jsonb) ORDER BY i.item_index)" in n]
    assert len(collects) == 1, "expected the plan of the instances' outputs collected"
    assert_executed_probes(collects[0], "dispatches", ("run_id", "task_key", "attempt"))


def test_a_lease_s_upstream_reads_each_dependency_s_attempt_by_key(db_dsn: str) -> None:
    """A lease carries its dependencies' outputs (awp._upstream). Joined to the attempts, with the statistics of many
    small runs the generic plan read every attempt of the run for each lease (so a run's leases together read it
    quadratically); each dependency's attempt is a probe of its key, as in awp._run_output."""
    runs, _ = settle_after_small_runs(db_dsn)
    for call, notices in explaining(db_dsn):
        plans = analyzed_plans(call, notices, "SELECT awp._upstream(%s, '{t000,t001,t002}')", [runs["wide"]])
        assert len(one(call, "SELECT awp._upstream(%s, '{t000,t001,t002}')", [runs["wide"]])[0]) == 3
    reads = [n for n in plans if "jsonb_object_agg(u.task_key" in n]
    assert len(reads) == 1, "expected the plan of the upstream's read"
    assert_executed_probes(reads[0], "dispatches", ("run_id", "task_key", "attempt"))
