"""One run per idempotency key under concurrency (db/functions/start_run.sql). Runs are partitioned by run id
(migration 0023), so (workflow_id, idempotency_key) is no longer a unique index of the table: ``awp._start_run``
takes a transaction advisory lock on the key and looks before it inserts. Two sessions start a run with one key at
once; the second waits for the first and returns its run."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from awp_testing.cluster import one


def test_two_starts_with_one_key_make_one_run(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(
            "SELECT awp.create_workflow_version(%s)",
            (Jsonb({"id": "keyed", "tasks": [{"key": "a", "executor": "mock"}]}),),
        )
    first = psycopg.connect(db_dsn)
    second_result: list[Any] = []
    try:
        run = one(first, "SELECT awp.start_run('keyed', NULL, 'k1', '{\"n\": 1}')")[
            0
        ]  # open transaction: not committed

        def second() -> None:
            with psycopg.connect(db_dsn, autocommit=True) as c2:
                second_result.append(one(c2, "SELECT awp.start_run('keyed', NULL, 'k1', '{\"n\": 1}')")[0])

        t = threading.Thread(target=second)
        t.start()
        t.join(1.0)
        assert t.is_alive(), "the second start waits for the first (same key)"
        with psycopg.connect(db_dsn, autocommit=True) as c3:
            waiting = one(
                c3,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database ="
                " (SELECT oid FROM pg_database WHERE datname = current_database())",
            )[0]
            assert waiting == 1, "it waits on the key's advisory lock"
        first.commit()
        t.join(10)
        assert second_result == [run], "the second start returns the first one's run"
        with psycopg.connect(db_dsn, autocommit=True) as c:
            assert one(c, "SELECT count(*) FROM awp.runs WHERE idempotency_key = 'k1'")[0] == 1
            other = one(c, "SELECT awp.start_run('keyed', NULL, 'k2', '{\"n\": 1}')")[0]
            assert other != run, "another key, another run"
    finally:
        first.close()
