"""Many runs started in one transaction, in a database whose statistics were taken while it was empty: each start
reads the new run's rows by key, so the thousandth start costs what the first did (AWP issue 46).

With those statistics the planner expected no run and no task, and the plans of a start (the new run's tasks and
their events, its ready queue rows, the run row written by ``awp._log_flush``) scanned every run or task the
transaction had started so far, once per start: 10,000 starts in one transaction took 26-38 s instead of 6, each
1,000 slower than the ones before. Measured here in shared buffers touched (EXPLAIN ANALYZE BUFFERS, nested
statements included), not in time, so a slow machine passes and a plan that scans does not."""

from __future__ import annotations

import json

import psycopg
from plan_support import buffers


def test_a_transaction_of_starts_costs_the_same_per_start(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(
            "SELECT * FROM awp.create_workflow_version(%s)",
            [json.dumps({"id": "one", "tasks": [{"key": "t", "executor": "mock"}]})],
        )
        c.execute("ANALYZE awp.runs, awp.tasks, awp.events, awp.ready_queue")  # the statistics of an empty database
    statement = "SELECT count(*) FROM awp.start_runs('one', 1, %s)"
    items = json.dumps([{}] * 200)
    with psycopg.connect(db_dsn) as c:  # a new session, one transaction: its plans are made under those statistics
        first = buffers(c, statement, [items])
        for _ in range(8):
            c.execute(statement, [items])
        tenth = buffers(c, statement, [items])
        c.rollback()
    # Scanning what the transaction started so far, the tenth call's starts read about ten times the rows (the run
    # rows alone, as awp._log_flush wrote them: about twice the first call's buffers).
    assert tenth < 1.5 * first, (first, tenth)
