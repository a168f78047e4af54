"""Many live runs in a database whose statistics were taken while it had few: the hot path stays a few probes per
call, and ``awp.refresh_statistics`` brings the statistics up to date (AWP issue 46).

With statistics of a nearly empty ``awp.runs``, the planner expected one or two live runs. A claim then read every
live run through ``runs_live_idx`` to look for a pending dispatch, ``awp._log_flush`` hashed every run to update
one, and the fairness order walked every live run of a backlog no worker serves: 5,900 shared buffers per
completion with 1,000 such runs (measured at commit 69ac892), 180 since. Measured here in shared buffers touched
(EXPLAIN ANALYZE BUFFERS, nested statements included), not in time, so a slow machine passes and a plan that
reads every live run does not."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from plan_support import buffers

from awp.dev.migrate import migrate

BACKLOG = 1000  # live runs, each with ready 'python' tasks; no worker serves python
SUCCESS = json.dumps({"kind": "success"})


@pytest.fixture(scope="module")
def stale(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """One session whose cached plans were made with the statistics of an almost empty database, then 1,000 live
    runs of a kind nobody serves."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        mock = [{"key": f"t{i}", "executor": "mock"} for i in range(99)]
        c.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps({"id": "mock", "tasks": mock})])
        py = [{"key": f"p{i}", "executor": "python", "action": "x"} for i in range(20)]
        c.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps({"id": "py", "tasks": py})])
        c.execute("ANALYZE awp.runs, awp.tasks, awp.dispatches")  # the statistics of an empty database
        c.execute(
            "SELECT awp.start_runs('py', 1, (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, %s)))", [BACKLOG]
        )
        yield c


def test_completions_do_not_read_every_live_run(stale: psycopg.Connection[Any]) -> None:
    c = stale
    row = c.execute("SELECT worker_id, session_token FROM awp.register_worker('w', '{mock}', 1)").fetchone()
    assert row is not None
    worker, token = row
    c.execute("SELECT awp.start_run('mock')")
    lease = c.execute("SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 1, 1)", [worker, token]).fetchone()
    assert lease is not None
    # The lease a completion hands back is kept in a temporary table, so the call can run under EXPLAIN ANALYZE.
    c.execute("CREATE TEMP TABLE lease (dispatch_id text, lease_token text)")
    c.execute(
        "CREATE FUNCTION pg_temp.step(w text, t text, d text, l text, r jsonb, seq bigint) RETURNS void"
        " LANGUAGE sql AS $$ DELETE FROM lease;"
        " INSERT INTO lease SELECT x.dispatch_id, x.lease_token FROM awp.complete_and_claim(w, t, d, l, r, 1, seq) x $$"
    )
    touched = []
    for seq in range(2, 60):  # warm first: the session's plans are made (and cached) under the stale statistics
        query = "SELECT pg_temp.step(%s, %s, %s, %s, %s, %s)"
        params = [worker, token, lease[0], lease[1], SUCCESS, seq]
        if seq > 20:
            touched.append(buffers(c, query, params))
        else:
            c.execute(query, params)
        lease = c.execute("SELECT dispatch_id, lease_token FROM lease").fetchone()
        assert lease is not None, f"no lease after completion {seq}"
    touched.sort()
    median = touched[len(touched) // 2]
    # A few hundred buffers per completion (its rows, indexes, the ready queue); reading every live run and
    # probing each costs at least 2 per run.
    assert median < BACKLOG, f"median {median} shared buffers per completion with {BACKLOG} live runs: {touched}"
    bad = c.execute("SELECT count(*) FROM awp.check_invariants()").fetchone()
    assert bad == (0,)


def test_refresh_statistics_analyzes_the_tables_that_changed(stale: psycopg.Connection[Any]) -> None:
    c = stale
    # awp.runs is partitioned (migration 0023): its partitions are analyzed with it, and counted.
    count = (
        "SELECT sum(analyze_count) FROM pg_stat_user_tables"
        " WHERE relid IN (SELECT relid FROM pg_partition_tree('awp.runs') WHERE isleaf)"
    )
    before = c.execute(count).fetchone()
    assert before is not None
    done: list[str] = []
    deadline = time.monotonic() + 30  # the backends' table counts reach pg_stat within a second or so
    while "runs" not in done and time.monotonic() < deadline:
        done += c.execute("SELECT awp.refresh_statistics()").fetchone()[0]  # type: ignore[index]
        if "runs" not in done:
            time.sleep(0.2)
    assert "runs" in done and "tasks" in done, done
    after = c.execute(count).fetchone()
    assert after is not None and after[0] > before[0]
    again = c.execute("SELECT awp.refresh_statistics()").fetchone()
    assert again is not None and "runs" not in again[0], "a table just analyzed is not analyzed again"
    live = c.execute(
        "SELECT sum(s.n_live_tup) FROM pg_stat_user_tables s"
        " WHERE s.relid IN (SELECT relid FROM pg_partition_tree('awp.runs') WHERE isleaf)"
    ).fetchone()
    assert live is not None and live[0] >= BACKLOG


def test_migrate_rebuilds_the_ready_queue(db_dsn: str, stale: psycopg.Connection[Any]) -> None:
    """Every migrate rebuilds awp.ready_queue from the tasks (an existing database's, or one changed with triggers
    off), under the lock of its triggers' creation."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("DELETE FROM awp.ready_queue WHERE run_id IN (SELECT run_id FROM awp.ready_queue LIMIT 10)")
        c.execute(
            "UPDATE awp.ready_queue SET ready_tasks = ready_tasks + 1 WHERE run_id IN "
            "(SELECT run_id FROM awp.ready_queue LIMIT 10)"
        )
        broken = c.execute("SELECT count(*) FROM awp.check_invariants() WHERE invariant = 'ready_queue'").fetchone()
        assert broken is not None and broken[0] >= 20
        migrate(db_dsn)
        rows = c.execute("SELECT count(*) FROM awp.ready_queue").fetchone()
        assert rows is not None and rows[0] >= BACKLOG  # the python backlog, one row per run
        bad = c.execute("SELECT count(*) FROM awp.check_invariants()").fetchone()
        assert bad == (0,)
