"""Migration 0023_partitioned_history on a database that has runs (db/migrations/0023_partitioned_history.sql): the
rows stay, in each table's _legacy partition; the runs go on (their new dispatches stay with them in the legacy
partition); idempotency keys still find their run; new runs get time ids in the time ranges; retention prunes the
legacy rows row by row; the invariants hold throughout."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from awp.dev.localdb import Server
from awp.dev.migrate import migrate
from awp_testing.cluster import database_before

SEED = (Path(__file__).parent / "seed_0022.sql").read_text()
TABLES = ("runs", "tasks", "events", "signals", "run_outputs", "task_output", "dispatches", "task_progress")
R_OK, R_LEASED, R_KEYED = (
    "run_c3d38db91d614b9784201f88bcee4b24",
    "run_09abe37304e044b88fc52996f0d5d00a",
    "run_115e341f45b9415d904c02432b718f03",
)


@pytest.fixture
def db_at_0022(pg_cluster: Server, tmp_path: Path) -> Iterator[str]:
    """A database migrated to 0022 (no functions), holding the rows of seed_0022.sql."""
    with database_before(pg_cluster, "0023", SEED, tmp_path) as dsn:
        yield dsn


def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {t: conn.execute(f"SELECT count(*) FROM awp.{t}").fetchone()[0] for t in TABLES}  # type: ignore[index]


def test_the_rows_stay_in_the_legacy_partitions_and_the_runs_go_on(db_at_0022: str) -> None:
    with psycopg.connect(db_at_0022) as conn:
        before = counts(conn)
    assert before["runs"] == 3 and before["events"] == 46, before

    assert "0023_partitioned_history.sql" in migrate(db_at_0022)

    with psycopg.connect(db_at_0022, autocommit=True) as conn:
        kinds: dict[str, str] = dict(
            conn.execute(
                "SELECT relname, relkind FROM pg_class WHERE relnamespace = 'awp'::regnamespace AND relname = ANY (%s)",
                (list(TABLES),),
            ).fetchall()
        )
        assert kinds == {t: "p" for t in TABLES}, "every run-scoped table is partitioned"
        assert counts(conn) == before, "no row lost"
        where = conn.execute(
            "SELECT DISTINCT tableoid::regclass::text FROM awp.runs UNION"
            " SELECT DISTINCT tableoid::regclass::text FROM awp.events UNION"
            " SELECT DISTINCT tableoid::regclass::text FROM awp.dispatches"
        ).fetchall()
        assert sorted(w for (w,) in where) == ["awp.dispatches_legacy", "awp.events_legacy", "awp.runs_legacy"]
        # The tables that were empty lost their legacy partition (a new database has none).
        assert conn.execute("SELECT to_regclass('awp.signals_legacy')").fetchone() == (None,)
        assert conn.execute("SELECT count(*) FROM awp.history_partitions").fetchone() == (2,)
        assert conn.execute("SELECT * FROM awp.check_invariants()").fetchall() == []

        # The same key and input find the run started before the migration; another input is refused.
        again = conn.execute("SELECT awp.start_run('legacy', NULL, 'key-1', '{\"x\": 1}')").fetchone()
        assert again == (R_KEYED,)
        with pytest.raises(psycopg.Error) as e:
            conn.execute("SELECT awp.start_run('legacy', NULL, 'key-1', '{\"x\": 2}')")
        assert e.value.sqlstate == "AWIDM"

        # The keyed run goes on: its dispatches stay beside it, in the legacy partition.
        wid, token = conn.execute(
            "SELECT worker_id, session_token FROM awp.register_worker('new', '{mock}', 4)"
        ).fetchone()  # type: ignore[misc]
        for _ in range(2):
            conn.execute("SELECT awp.coordinator_tick()")
            leases = conn.execute(
                "SELECT dispatch_id, lease_token, run_id FROM awp.claim_tasks(%s, %s, 4)", (wid, token)
            ).fetchall()
            for dispatch_id, lease, run_id in leases:
                if run_id == R_KEYED:
                    assert not dispatch_id.startswith("dsp_t"), "a legacy run's dispatch keeps the old id form"
                conn.execute(
                    'SELECT awp.complete_task(%s, %s, %s, %s, \'{"kind": "success"}\')',
                    (wid, token, dispatch_id, lease),
                )
        assert conn.execute("SELECT status FROM awp.runs WHERE run_id = %s", (R_KEYED,)).fetchone() == ("succeeded",)
        assert conn.execute(
            "SELECT DISTINCT tableoid::regclass::text FROM awp.dispatches WHERE run_id = %s", (R_KEYED,)
        ).fetchall() == [("awp.dispatches_legacy",)]

        # A new run gets a time id, in the current range, and so do its dispatches.
        new = conn.execute("SELECT awp.start_run('legacy')").fetchone()[0]  # type: ignore[index]
        assert new.startswith("run_t")
        suffix = conn.execute("SELECT suffix FROM awp.history_partitions ORDER BY lower_ms LIMIT 1").fetchone()[0]  # type: ignore[index]
        assert conn.execute("SELECT tableoid::regclass::text FROM awp.runs WHERE run_id = %s", (new,)).fetchone() == (
            f"awp.runs_p{suffix}",
        )
        d = conn.execute(
            "SELECT dispatch_id, tableoid::regclass::text FROM awp.dispatches WHERE run_id = %s", (new,)
        ).fetchone()
        assert d is not None and d[0].startswith("dsp_" + new[4:17]) and d[1] == f"awp.dispatches_p{suffix}"
        assert conn.execute("SELECT * FROM awp.check_invariants()").fetchall() == []

        # Retention: the finished legacy runs go row by row, with all their rows.
        conn.execute("SELECT awp.request_cancel(%s)", (R_LEASED,))
        conn.execute("SELECT awp.coordinator_tick()")
        conn.execute("SELECT awp.request_cancel(%s)", (new,))
        conn.execute("SELECT awp.coordinator_tick()")
        pruned = conn.execute("SELECT awp.prune('0')").fetchone()[0]  # type: ignore[index]
        live = conn.execute("SELECT run_id, status FROM awp.runs").fetchall()
        assert pruned["runs"] == 4 - len(live), (pruned, live)
        assert all(s in ("pending", "running") for _, s in live), live
        assert conn.execute("SELECT count(*) FROM awp.runs WHERE run_id IN (%s, %s)", (R_OK, R_KEYED)).fetchone() == (
            0,
        )
        assert conn.execute(
            "SELECT count(*) FROM awp.events_legacy WHERE run_id IN (%s, %s)", (R_OK, R_KEYED)
        ).fetchone() == (0,)
        assert conn.execute("SELECT * FROM awp.check_invariants()").fetchall() == []
