"""``awp demo`` runs to the end: real gateway and workers, a worker killed mid-run, the takeover shown."""

from __future__ import annotations

import os
import subprocess

import psycopg
from worker_support import REPO

from awp.dev.procs import awp_command
from awp_testing.cluster import one


def test_demo_runs_to_the_end_with_a_takeover(db_dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWP_")}
    proc = subprocess.run(
        awp_command("demo", "--database-url", db_dsn, "--fast"),
        env={**env, "COLUMNS": "200"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "kill -9" in out
    assert "attempt 2 on" in out  # the killed worker's task, taken over by another worker
    assert "flaky task transform-05: succeeded after 2 attempts" in out
    assert "30 tasks: succeeded 30" in out
    assert "gateway exited with 0" in out
    # Data flow: the fan-in tasks received the run's input and their dependencies' outputs.
    assert 'validate-a (mock, echo) received run_input {"batch": "demo-1"' in out
    assert "the outputs of transform-01, transform-02, transform-03, transform-04" in out
    assert "summarize (python) read ctx.run_input batch='demo-1' and ctx.upstream from validate-a, validate-b" in out
    assert 'run output (the tasks no other task depends on): {"report": {"report": "ok"}}' in out
    with psycopg.connect(db_dsn) as conn:
        workers: dict[str, int] = dict(
            conn.execute("SELECT status, count(*) FROM awp.list_workers() GROUP BY status").fetchall()
        )
        settings = one(conn, "SELECT awp.get_settings()")[0]
    assert workers == {"stopped": 2, "offline": 1}, "two drained workers, one killed"
    assert settings["lease_duration_ms"] == 15000, "the demo restores the settings it changed"


def test_the_dynamic_demo_runs_to_the_end(db_dsn: str) -> None:
    """``awp demo --dynamic`` (make demo-dynamic): for_each over chunks made at run time, when, a child run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWP_")}
    proc = subprocess.run(
        awp_command("demo", "--database-url", db_dsn, "--fast", "--dynamic"),
        env={**env, "COLUMNS": "200"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "chunk cut the document into 7 chunks; summarize ran as 7 instances summarize[0]..summarize[6]" in out
    assert "7 succeeded" in out
    assert "long=True" in out
    assert "short-note: skipped (condition_false)" in out
    assert 'of demo-review-fast succeeded; its output became review\'s: {"approve": {"approved": true}}' in out
    assert "gateway exited with 0" in out
