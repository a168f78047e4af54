"""A big run in a database of small runs: the functions that look up a task's dependencies probe the primary key
once per dependency, whatever the statistics say.

With statistics gathered while runs were small (a handful of tasks each), the planner expects a handful of tasks
per run, and a lookup written as ``task_key = ANY (depends_on)`` or as a join was planned as a scan of the whole
run per waiting task: O(n²) for a fan-in. ``get_run`` of a 10,000-task fan-in took 12-16 s and hit the gateway's
statement timeout (the dashboard answered 503), and every claim of a task of such a run paid ~1 ms for
``awp._upstream``. Measured here in shared buffers touched (EXPLAIN ANALYZE BUFFERS), not in time, so a slow
machine passes and a plan that scans the run per task does not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from plan_support import buffers

N = 2000  # tasks of the big run: root -> N-2 parts -> merge


@pytest.fixture(scope="module")
def big_run(db_dsn: str) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        small = [{"key": f"s{i}", "executor": "python", "action": "x"} for i in range(3)]
        c.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps({"id": "small", "tasks": small})])
        c.execute("SELECT awp.start_run('small') FROM generate_series(1, 300)")
        c.execute("ANALYZE awp.tasks")  # the statistics of a database of small runs
        parts = [f"p{i:05d}" for i in range(N - 2)]
        tasks: list[dict[str, Any]] = [{"key": "root", "executor": "python", "action": "x"}]
        tasks += [{"key": k, "executor": "python", "action": "x", "depends_on": ["root"]} for k in parts]
        tasks.append({"key": "merge", "executor": "python", "action": "x", "depends_on": parts})
        c.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps({"id": "big", "tasks": tasks})])
        row = c.execute("SELECT awp.start_run('big')").fetchone()
        assert row is not None
        yield c, row[0]


def test_the_wait_reasons_of_a_fan_in_probe_each_dependency(big_run: tuple[psycopg.Connection[Any], str]) -> None:
    c, run_id = big_run
    waiting = c.execute("SELECT count(*) FROM awp.run_waits(%s)", [run_id]).fetchone()
    assert waiting is not None and waiting[0] == N  # every task waits (no worker offers python)
    for query in ("SELECT * FROM awp.get_run(%s)", "SELECT * FROM awp.run_waits(%s)"):
        touched = buffers(c, query, [run_id])
        # A probe per dependency: a few buffers per waiting task. A scan of the run per task: N * N / rows-per-page.
        assert touched < 25 * N, f"{query}: {touched} buffers for {N} waiting tasks"


def test_upstream_probes_each_dependency(big_run: tuple[psycopg.Connection[Any], str]) -> None:
    c, run_id = big_run
    calls = 200
    # As its callers run it (the protocol's functions set plan_cache_mode: db/functions/zz_grants.sql). Left to
    # PostgreSQL's choice, each call is planned again (a custom plan prunes the partitions), and planning touches
    # about 30 buffers more a call.
    c.execute("SET plan_cache_mode = force_generic_plan")
    try:
        lookups = f"SELECT count(awp._upstream(%s, ARRAY['root'])) FROM generate_series(1, {calls})"
        touched = buffers(c, lookups, [run_id])
    finally:
        c.execute("RESET plan_cache_mode")
    # A probe is 3-10 buffers a call; a scan of the 2,000-task run is over 100 a call.
    assert touched < 30 * calls, f"{touched} buffers for {calls} lookups of one dependency"
