"""The invariant checker finds each kind of violation (planted by a superuser) and nothing on clean data."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from awp.dev.migrate import default_sql_dir

AWP = str(Path(sys.executable).parent / "awp")


@pytest.fixture
def db(db_dsn: str):
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as c:
        yield c


@pytest.fixture
def finished_run(db) -> dict[str, Any]:
    """A run of a -> b where a failed once (retry) and then everything succeeded."""
    db.execute(
        "SELECT * FROM awp.create_workflow_version(%s)",
        [
            json.dumps(
                {
                    "id": "inv",
                    "concurrency": 2,
                    "tasks": [
                        {"key": "a", "executor": "mock", "retry": {"max_attempts": 2, "interval_ms": 0}},
                        {"key": "b", "executor": "mock", "depends_on": ["a"]},
                    ],
                }
            )
        ],
    )
    run_id = db.execute("SELECT awp.start_run('inv') AS r").fetchone()["r"]
    w = db.execute("SELECT * FROM awp.register_worker('w', ARRAY['mock'], 2)").fetchone()
    worker = [w["worker_id"], w["session_token"]]
    for kind in ["temporary_failure", "success", "success"]:
        db.execute("SELECT awp.coordinator_tick()")
        [lease] = db.execute("SELECT * FROM awp.claim_tasks(%s, %s, 1)", worker).fetchall()
        db.execute(
            "SELECT awp.complete_task(%s, %s, %s, %s, %s)",
            [*worker, lease["dispatch_id"], lease["lease_token"], json.dumps({"kind": kind})],
        )
    assert db.execute("SELECT status FROM awp.get_run(%s)", [run_id]).fetchone()["status"] == "succeeded"
    return {"run_id": run_id, "worker_id": w["worker_id"]}


def violations(db, run_id: str) -> set[str]:
    return {r["invariant"] for r in db.execute("SELECT * FROM awp.check_invariants(ARRAY[%s])", [run_id])}


PLANTED = {
    "run_tasks_terminal": "UPDATE awp.tasks SET status = 'ready', finished_at = NULL"
    " WHERE run_id = %(run)s AND task_key = 'b'",
    "one_success_per_task": "UPDATE awp.attempts SET status = 'succeeded'"
    " WHERE run_id = %(run)s AND task_key = 'a' AND attempt = 1",
    "attempt_dispatch_match": "UPDATE awp.dispatches SET status = 'expired', result_hash = NULL"
    " WHERE run_id = %(run)s AND task_key = 'b'",
    "accepted_after_expiry": "UPDATE awp.dispatches SET lease_expires_at = finished_at, attempt_deadline = finished_at"
    " WHERE run_id = %(run)s AND task_key = 'b'",
    "attempts_within_max": "UPDATE awp.tasks SET attempts = 1, max_attempts = 1"
    " WHERE run_id = %(run)s AND task_key = 'a'",
    "started_before_deps": "UPDATE awp.attempts SET started_at = started_at - interval '1 hour'"
    " WHERE run_id = %(run)s AND task_key = 'b'",
    "events_contiguous": "DELETE FROM awp.events WHERE run_id = %(run)s AND sequence = 3",
    "unfinished_count": "UPDATE awp.runs SET unfinished_tasks = 1 WHERE run_id = %(run)s",
    "final_task_counts": "UPDATE awp.runs SET final_task_counts = '{\"succeeded\": 3}' WHERE run_id = %(run)s",
    "events_match_status": "UPDATE awp.runs SET status = 'failed', output = NULL WHERE run_id = %(run)s",
    "illegal_transition": "UPDATE awp.events SET from_status = 'succeeded' WHERE run_id = %(run)s"
    " AND entity_type = 'run' AND to_status = 'succeeded'",
    "run_concurrency": "UPDATE awp.runs SET concurrency = 1 WHERE run_id = %(run)s;"
    " UPDATE awp.tasks SET status = 'queued', finished_at = NULL WHERE run_id = %(run)s",
    "worker_capacity": "UPDATE awp.dispatches SET status = 'leased', finished_at = NULL, result_hash = NULL"
    " WHERE run_id = %(run)s AND attempt = 1; UPDATE awp.workers SET max_concurrency = 1",
    # A succeeded task with a pending dispatch (a live dispatch that nothing will ever lease).
    # (A dispatch id begins with its run's time: CHECK dispatch_in_run_range, migration 0023.)
    "task_dispatch_match": "INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, created_at)"
    " VALUES ('dsp_' || substr(%(run)s, 5, 13) || 'plantedb', %(run)s, 'b', 'mock', now())",
    # Two live dispatches, one more than the limit allows.
    "dispatch_limit": "INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, created_at)"
    " VALUES ('dsp_' || substr(%(run)s, 5, 13) || 'planteda', %(run)s, 'a', 'mock', now()),"
    " ('dsp_' || substr(%(run)s, 5, 13) || 'plantedb', %(run)s, 'b', 'mock', now());"
    " UPDATE awp.settings SET dispatch_limit = 1",
    # The run's row gone, its tasks and events left (no foreign key holds them since migration 0023).
    "orphan_row": "DELETE FROM awp.runs WHERE run_id = %(run)s",
    # A time range of history without its partitions (db/functions/_partitions.sql).
    "history_partitions": "INSERT INTO awp.history_partitions VALUES (1, 2, 'planted', now())",
    # A queue row for a run with no ready task (the fairness order would offer it for nothing).
    "ready_queue": "INSERT INTO awp.ready_queue (run_id, executor_kind, ready_tasks, last_dispatch_seq, created_at)"
    " VALUES (%(run)s, 'mock', 1, NULL, now())",
    # A for_each task said to have two instances, with none (docs/dynamic.md).
    "for_each_instances": "UPDATE awp.tasks SET for_each = 'a', max_items = 10, item_count = 2"
    " WHERE run_id = %(run)s AND task_key = 'b'",
    # A child-run task (run by the database) with a worker's dispatch.
    "child_run": "UPDATE awp.tasks SET executor = 'workflow' WHERE run_id = %(run)s AND task_key = 'b'",
    # A signal task (run by the database, docs/waits.md) with a worker's dispatch.
    "database_task": "UPDATE awp.tasks SET executor = 'signal' WHERE run_id = %(run)s AND task_key = 'b'",
    # Two tasks in flight behind a limit of one, both dispatched after it was set (docs/limits.md).
    "rate_limit": "INSERT INTO awp.limits VALUES ('planted', 1, NULL, NULL, now(), now() - interval '1 day');"
    " UPDATE awp.tasks SET status = 'running', finished_at = NULL, limit_buckets = '{planted}'"
    " WHERE run_id = %(run)s AND task_key IN ('a', 'b');"
    " UPDATE awp.dispatches SET status = 'leased', finished_at = NULL, result_hash = NULL, attempt_status = 'running',"
    " attempt_finished_at = NULL, output = NULL WHERE run_id = %(run)s AND task_key IN ('a', 'b')"
    " AND attempt = (SELECT t.attempts FROM awp.tasks t WHERE t.run_id = dispatches.run_id"
    " AND t.task_key = dispatches.task_key)",
}


def checker_invariants() -> tuple[set[str], set[str]]:
    """The invariant names awp.check_invariants() can report (parsed from its SQL: ``SELECT '<name>', ...``),
    and the names its header comment documents."""
    text = (default_sql_dir() / "functions" / "check_invariants.sql").read_text()
    reported = set(re.findall(r"^\s*SELECT '([a-z_]+)',", text, re.MULTILINE))
    header = text[text.index("-- Checks") : text.index("-- Takes no locks")]
    documented = set(re.findall(r"^--\s{3}([a-z_]+)\s", header, re.MULTILINE))
    return reported, documented


def test_every_invariant_of_the_checker_has_a_planted_violation():
    """A new invariant needs a planted violation in PLANTED (so it is shown to fire) and a line in the header."""
    reported, documented = checker_invariants()
    assert len(reported) >= 14, f"parsing check_invariants.sql found only {sorted(reported)}"
    assert reported - set(PLANTED) == set(), "invariants without a planted violation in PLANTED"
    assert set(PLANTED) - reported == set(), "planted violations of invariants the checker does not report"
    assert documented == reported, "the header comment of check_invariants.sql lists other invariants"


def test_a_clean_run_has_no_violation(db, finished_run):
    assert violations(db, finished_run["run_id"]) == set()


@pytest.mark.parametrize("invariant", sorted(PLANTED))
def test_each_planted_violation_is_reported_with_its_ids(db, finished_run, invariant):
    with pytest.raises(_Rollback), db.transaction():
        for statement in PLANTED[invariant].split(";"):
            db.execute(statement, {"run": finished_run["run_id"]})
        rows = db.execute("SELECT * FROM awp.check_invariants()").fetchall()
        assert invariant in {r["invariant"] for r in rows}
        assert all(r["detail"] for r in rows)
        raise _Rollback
    assert violations(db, finished_run["run_id"]) == set()


def test_awp_check_exits_non_zero_on_a_violation(db, db_dsn, finished_run):
    env = {"AWP_DATABASE_URL": db_dsn, "PATH": "/usr/bin:/bin"}
    ok = subprocess.run([AWP, "check", finished_run["run_id"]], capture_output=True, text=True, env=env, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "0 violation(s)" in ok.stdout
    nope = subprocess.run([AWP, "check", "run_nope"], capture_output=True, text=True, env=env, check=False)
    assert nope.returncode == 1 and "no such run: run_nope" in nope.stderr, nope  # not "0 violation(s)"
    db.execute("UPDATE awp.runs SET status = 'failed', output = NULL WHERE run_id = %s", [finished_run["run_id"]])
    try:
        bad = subprocess.run([AWP, "check"], capture_output=True, text=True, env=env, check=False)
        assert bad.returncode == 1
        assert "events_match_status" in bad.stdout and finished_run["run_id"] in bad.stdout
    finally:
        db.execute("UPDATE awp.runs SET status = 'succeeded' WHERE run_id = %s", [finished_run["run_id"]])


class _Rollback(Exception):
    """Raised inside a transaction block to undo a planted violation."""


def test_a_client_cannot_freeze_the_clock_of_a_real_database(db):
    """awp.test_now is honoured only in test databases (with pgTAP); this one has none."""
    db.execute("SET awp.test_now = '2001-01-01 00:00:00+00'")
    try:
        year = db.execute("SELECT extract(year FROM awp._now())::int AS y").fetchone()["y"]
    finally:
        db.execute("RESET awp.test_now")
    assert year > 2001
