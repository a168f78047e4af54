"""Migration 0011_final_task_counts on a database that has runs (db/migrations/0011_final_task_counts.sql): every
finished run gets its task counts stored, a live run none, and the reads show the same counts as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from awp.dev.localdb import Server
from awp.dev.migrate import migrate
from awp_testing.cluster import database_before

T = "'2030-01-01 00:00+00'"
# Three runs as version 0010 stored them: one succeeded (2 tasks), one canceled after its first task succeeded,
# one running (a task ready, its dependant waiting).
SEED = f"""
INSERT INTO awp.workflows VALUES ('wf', {T});
INSERT INTO awp.workflow_versions VALUES ('wf', 1, '{{}}', 'h', 3, {T});
INSERT INTO awp.runs (run_id, workflow_id, workflow_version, status, concurrency, unfinished_tasks, created_at,
                      started_at, finished_at)
VALUES ('ok', 'wf', 1, 'succeeded', 2, 0, {T}, {T}, {T}),
       ('cx', 'wf', 1, 'canceled', 2, 0, {T}, {T}, {T}),
       ('live', 'wf', 1, 'running', 2, 2, {T}, {T}, NULL);
INSERT INTO awp.tasks (run_id, task_key, ordinal, executor, action, input, depends_on, dependants, pending_deps,
                       max_attempts, interval_ms, timeout_ms, status, attempts, uncounted_attempts, updated_at,
                       finished_at)
VALUES ('ok', 'a', 1, 'mock', 'x', '{{}}', '{{}}', '{{}}', 0, 1, 0, 1000, 'succeeded', 1, 0, {T}, {T}),
       ('ok', 'b', 2, 'mock', 'x', '{{}}', '{{}}', '{{}}', 0, 1, 0, 1000, 'succeeded', 1, 0, {T}, {T}),
       ('cx', 'a', 1, 'mock', 'x', '{{}}', '{{}}', '{{b}}', 0, 1, 0, 1000, 'succeeded', 1, 0, {T}, {T}),
       ('cx', 'b', 2, 'mock', 'x', '{{}}', '{{a}}', '{{}}', 0, 1, 0, 1000, 'canceled', 0, 0, {T}, {T}),
       ('live', 'a', 1, 'mock', 'x', '{{}}', '{{}}', '{{b}}', 0, 1, 0, 1000, 'ready', 0, 0, {T}, NULL),
       ('live', 'b', 2, 'mock', 'x', '{{}}', '{{a}}', '{{}}', 1, 1, 0, 1000, 'waiting_dependencies', 0, 0, {T}, NULL);
"""


@pytest.fixture
def db_at_0010(pg_cluster: Server, tmp_path: Path) -> Iterator[str]:
    """A database migrated to 0010 (no functions), seeded with SEED."""
    with database_before(pg_cluster, "0011", SEED, tmp_path) as dsn:
        yield dsn


def test_every_finished_run_gets_its_counts_and_a_live_run_none(db_at_0010: str) -> None:
    applied = migrate(db_at_0010)
    assert "0011_final_task_counts.sql" in applied

    with psycopg.connect(db_at_0010) as conn:
        stored: dict[str, object] = dict(conn.execute("SELECT run_id, final_task_counts FROM awp.runs").fetchall())
        assert stored == {"ok": {"succeeded": 2}, "cx": {"succeeded": 1, "canceled": 1}, "live": None}
        listed: dict[str, object] = dict(conn.execute("SELECT run_id, task_counts FROM awp.list_runs()").fetchall())
        assert listed == {
            "ok": {"succeeded": 2},
            "cx": {"succeeded": 1, "canceled": 1},
            "live": {"ready": 1, "waiting_dependencies": 1},
        }
        found = conn.execute("SELECT run_id FROM awp.check_invariants() WHERE invariant = 'final_task_counts'")
        assert found.fetchall() == []
