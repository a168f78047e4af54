"""Migration 0010_fold_attempts on a database that has data (db/migrations/0010_fold_attempts.sql): every attempt of
the old awp.attempts table moves onto its dispatch and reads back the same through the awp.attempts view."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from awp.dev.localdb import Server
from awp.dev.migrate import MigrationError, migrate
from awp_testing.cluster import database_before

DB = Path(__file__).resolve().parents[3] / "db"
# The old table's columns (migration 0018 appended error_detail to the view).
ATTEMPTS = (
    "SELECT run_id, task_key, attempt, dispatch_id, worker_id, fencing_token, status, started_at, deadline,"
    " finished_at, output, error_code, error_message, counted FROM awp.attempts ORDER BY dispatch_id"
)

# One run of three tasks as version 0009 stored it: `a` was interrupted once (an attempt not counted) and then
# succeeded, `b` is running, `c` is queued with a pending dispatch (no attempt).
SEED = """
INSERT INTO awp.workflows VALUES ('wf', '2030-01-01 00:00+00');
INSERT INTO awp.workflow_versions VALUES ('wf', 1, '{}', 'h', 3, '2030-01-01 00:00+00');
INSERT INTO awp.runs (run_id, workflow_id, workflow_version, status, concurrency, unfinished_tasks, created_at,
                      started_at)
VALUES ('run1', 'wf', 1, 'running', 3, 2, '2030-01-01 00:00+00', '2030-01-01 00:00+00');
INSERT INTO awp.tasks (run_id, task_key, ordinal, executor, action, input, depends_on, dependants, pending_deps,
                       max_attempts, interval_ms, timeout_ms, status, attempts, uncounted_attempts, updated_at,
                       finished_at)
VALUES ('run1', 'a', 1, 'mock', 'x', '{}', '{}', '{}', 0, 3, 0, 1000, 'succeeded', 2, 1, '2030-01-01 00:00:05+00',
        '2030-01-01 00:00:05+00'),
       ('run1', 'b', 2, 'mock', 'x', '{}', '{}', '{}', 0, 3, 0, 1000, 'running', 1, 0, '2030-01-01 00:00:06+00', NULL),
       ('run1', 'c', 3, 'mock', 'x', '{}', '{}', '{}', 0, 3, 0, 1000, 'queued', 0, 0, '2030-01-01 00:00:06+00', NULL);
INSERT INTO awp.workers (worker_id, display_name, executor_kinds, max_concurrency, protocol_version,
                         session_token_hash, registered_at, last_heartbeat_at)
VALUES ('w1', 'w1', '{mock}', 2, 1, sha256('s'), '2030-01-01 00:00+00', '2030-01-01 00:00+00');
INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, status, created_at, worker_id,
                            lease_token_hash, attempt, fencing_token, leased_at, lease_expires_at, attempt_deadline,
                            result_hash, finished_at, claim_seq, uncounted)
VALUES ('d1', 'run1', 'a', 'mock', 'expired', '2030-01-01 00:00+00', 'w1', sha256('1'), 1, 1,
        '2030-01-01 00:00:01+00', '2030-01-01 00:00:02+00', '2030-01-01 00:00:03+00', NULL, '2030-01-01 00:00:02+00',
        7, 'not_received'),
       ('d2', 'run1', 'a', 'mock', 'completed', '2030-01-01 00:00:02+00', 'w1', sha256('2'), 2, 2,
        '2030-01-01 00:00:04+00', '2030-01-01 00:00:05+00', '2030-01-01 00:00:06+00', sha256('r'),
        '2030-01-01 00:00:05+00', 8, NULL),
       ('d3', 'run1', 'b', 'mock', 'leased', '2030-01-01 00:00:05+00', 'w1', sha256('3'), 1, 3,
        '2030-01-01 00:00:06+00', '2030-01-01 00:00:07+00', '2030-01-01 00:00:08+00', NULL, NULL, 9, NULL);
INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, created_at)
VALUES ('d4', 'run1', 'c', 'mock', '2030-01-01 00:00:06+00');
INSERT INTO awp.attempts (run_id, task_key, attempt, dispatch_id, worker_id, fencing_token, status, started_at,
                          deadline, finished_at, output, error_code, error_message, counted)
VALUES ('run1', 'a', 1, 'd1', 'w1', 1, 'not_received', '2030-01-01 00:00:01+00', '2030-01-01 00:00:03+00',
        '2030-01-01 00:00:02+00', NULL, 'not_received', 'lost', false),
       ('run1', 'a', 2, 'd2', 'w1', 2, 'succeeded', '2030-01-01 00:00:04+00', '2030-01-01 00:00:06+00',
        '2030-01-01 00:00:05+00', '{"rows": 3}', NULL, NULL, true),
       ('run1', 'b', 1, 'd3', 'w1', 3, 'running', '2030-01-01 00:00:06+00', '2030-01-01 00:00:08+00',
        NULL, NULL, NULL, NULL, true);
"""


@pytest.fixture
def db_at_0009(pg_cluster: Server, tmp_path: Path) -> Iterator[str]:
    """A database migrated to 0009 (no functions), seeded with SEED."""
    with database_before(pg_cluster, "0010", SEED, tmp_path) as dsn:
        yield dsn


def test_every_attempt_moves_onto_its_dispatch_and_reads_back_the_same(db_at_0009: str) -> None:
    with psycopg.connect(db_at_0009) as conn:
        before = conn.execute(ATTEMPTS).fetchall()
    assert len(before) == 3

    applied = migrate(db_at_0009, DB)
    assert "0010_fold_attempts.sql" in applied

    with psycopg.connect(db_at_0009) as conn:
        assert conn.execute(ATTEMPTS).fetchall() == before
        assert conn.execute("SELECT relkind FROM pg_class WHERE oid = 'awp.attempts'::regclass").fetchone() == ("v",)
        # The pending dispatch has no attempt, and none of the attempt's columns.
        assert conn.execute(
            "SELECT attempt_status, attempt_finished_at, output, error_code FROM awp.dispatches"
            " WHERE dispatch_id = 'd4'"
        ).fetchone() == (None, None, None, None)
        # The read function shows the moved attempts, in order, with their outputs and errors.
        history = conn.execute(
            "SELECT attempt, status, dispatch_id, output, error_code FROM awp.task_attempts('run1', 'a')"
        ).fetchall()
        assert history == [(1, "not_received", "d1", None, "not_received"), (2, "succeeded", "d2", {"rows": 3}, None)]
        # The attempt that was running is still running, on its still leased dispatch.
        assert conn.execute(
            "SELECT status FROM awp.attempts WHERE run_id = 'run1' AND task_key = 'b' AND attempt = 1"
        ).fetchone() == ("running",)


def test_an_attempt_that_disagrees_with_its_dispatch_stops_the_migration_and_changes_nothing(db_at_0009: str) -> None:
    with psycopg.connect(db_at_0009, autocommit=True) as conn:
        conn.execute("UPDATE awp.attempts SET started_at = started_at - interval '1 s' WHERE dispatch_id = 'd2'")
        before = conn.execute(ATTEMPTS).fetchall()

    with pytest.raises(MigrationError, match=r"0010_fold_attempts\.sql") as err:
        migrate(db_at_0009, DB)
    assert "an attempt and its dispatch disagree" in str(err.value)

    with psycopg.connect(db_at_0009) as conn:
        assert conn.execute("SELECT relkind FROM pg_class WHERE oid = 'awp.attempts'::regclass").fetchone() == ("r",)
        assert conn.execute(ATTEMPTS).fetchall() == before
        assert conn.execute(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'awp'"
            " AND table_name = 'dispatches' AND column_name = 'attempt_status'"
        ).fetchone() == (0,)
