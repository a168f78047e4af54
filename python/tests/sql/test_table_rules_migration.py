"""Migration 0025_table_rules on a database that has runs (db/migrations/0025_table_rules.sql): the rows of
seed_0022.sql (taken through 0023 and 0024 first) stay, each table's CHECK constraints become its one rules
constraint on every partition, the rows are checked against it and go on being written, and a broken rule is still
refused with its own name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from awp.dev.localdb import Server
from awp.dev.migrate import migrate
from awp_testing.cluster import database_before, migrate_before

SEED = (Path(__file__).parent / "seed_0022.sql").read_text()
RULE_TABLES = ("runs", "tasks", "dispatches", "task_progress", "task_output", "workers")
COUNTED = ("runs", "tasks", "dispatches", "events", "workers")


@pytest.fixture
def db_at_0024(pg_cluster: Server, tmp_path: Path) -> Iterator[str]:
    """A database migrated to 0024 (no functions), holding the rows of seed_0022.sql."""
    with database_before(pg_cluster, "0023", SEED, tmp_path / "at_0022") as dsn:
        migrate_before(dsn, "0025", tmp_path / "at_0024")
        yield dsn


def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {t: conn.execute(f"SELECT count(*) FROM awp.{t}").fetchone()[0] for t in COUNTED}  # type: ignore[index]


def check_constraints(conn: psycopg.Connection[Any], table: str) -> list[tuple[str, str]]:
    """(relation, constraint) of every CHECK of ``table`` and of its partitions."""
    return conn.execute(
        "SELECT c.conrelid::regclass::text, c.conname::text FROM pg_constraint c"
        " WHERE c.contype = 'c' AND (c.conrelid = %s::regclass"
        "   OR c.conrelid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = %s::regclass))"
        " ORDER BY 1, 2",
        (f"awp.{table}", f"awp.{table}"),
    ).fetchall()


def test_the_rows_stay_and_each_table_keeps_its_rules_in_one_constraint(db_at_0024: str) -> None:
    with psycopg.connect(db_at_0024) as conn:
        before = counts(conn)
        old_dispatch_checks = {name for _, name in check_constraints(conn, "dispatches")}
    assert before["runs"] == 3 and before["dispatches"] > 0, before
    assert "dispatch_status_is_valid" in old_dispatch_checks

    assert "0025_table_rules.sql" in migrate(db_at_0024)

    with psycopg.connect(db_at_0024, autocommit=True) as conn:
        assert counts(conn) == before, "no row lost"
        for table in RULE_TABLES:
            found = check_constraints(conn, table)
            assert found and {name for _, name in found} == {f"{table}_rules"}, (table, found)
        legacy = {rel for rel, _ in check_constraints(conn, "dispatches")}
        assert "awp.dispatches_legacy" in legacy, "the partition holding the old rows has the constraint too"
        # The rules the old constraints named are still there, by name.
        rules = {
            r for (r,) in conn.execute("SELECT rule FROM awp.check_rules WHERE table_name = 'awp.dispatches'::regclass")
        }
        assert rules == old_dispatch_checks
        assert conn.execute("SELECT * FROM awp.check_invariants()").fetchall() == []

        # A row of the old data that would break a rule is refused by its name.
        run_id = conn.execute("SELECT run_id FROM awp.runs ORDER BY run_id LIMIT 1").fetchone()[0]  # type: ignore[index]
        with pytest.raises(psycopg.errors.CheckViolation) as e:
            conn.execute("UPDATE awp.runs SET priority = 10 WHERE run_id = %s", (run_id,))
        assert e.value.diag.constraint_name == "run_priority_in_range"
        assert e.value.diag.table_name == "runs"

        # The old rows go on being written: a change that keeps every rule passes; the old runs are canceled.
        conn.execute("UPDATE awp.runs SET priority = 9 WHERE run_id = %s", (run_id,))
        canceled = conn.execute("SELECT awp.request_cancel(run_id) FROM awp.runs WHERE finished_at IS NULL").fetchall()
        assert canceled, "the seed has runs that had not finished"
        conn.execute("SELECT awp.coordinator_tick()")
        assert conn.execute("SELECT count(*) FROM awp.tasks WHERE status = 'canceled'").fetchone()[0] > 0  # type: ignore[index]
        assert conn.execute("SELECT * FROM awp.check_invariants()").fetchall() == []
