"""Behind PgBouncer (docs/operations.md, Behind PgBouncer; AWP issue 43): `awp serve --pgbouncer` sends its requests
through a real PgBouncer (Debian's 1.18) in transaction pooling mode, which refuses libpq's `options` and cannot keep
prepared statements, session advisory locks or LISTEN; the coordinator and the LISTEN connection go straight to the
server (--direct-database-url). A DAG of runs succeeds with workers over real HTTP, PgBouncer counted the
gateway's transactions, the coordinator led on its direct session, and a setting the pooled connections lack is
named in a WARNING. `make pgbouncer-test` runs the HTTP and worker end-to-end suite the same way."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from worker_support import REPO, Workers, apply, mock_task, start_run, wait_run

from awp.dev.localdb import Server
from awp_testing import pgbouncer
from awp_testing.gateway import serve, wait_until

pytestmark = pytest.mark.slow  # real PgBouncer, gateway and worker processes


@pytest.fixture(scope="module")
def bouncer(pg_cluster: Server) -> Iterator[int]:
    with pgbouncer.pgbouncer(pg_cluster.dsn()) as port:
        yield port


def pooled_env(db_dsn: str, port: int) -> dict[str, str]:
    return {
        "AWP_DATABASE_URL": pgbouncer.pooled_dsn(db_dsn, port),
        "AWP_DIRECT_DATABASE_URL": db_dsn,
        "AWP_PGBOUNCER": "1",
    }


def transactions(port: int, dbname: str) -> int:
    return sum(
        int(str(r["total_xact_count"])) for r in pgbouncer.console(port, "SHOW STATS") if r["database"] == dbname
    )


def test_runs_succeed_with_the_requests_through_pgbouncer(db_dsn: str, bouncer: int) -> None:
    dbname = str(psycopg.conninfo.conninfo_to_dict(db_dsn)["dbname"])
    before = transactions(bouncer, dbname)
    with serve(db_dsn, env=pooled_env(db_dsn, bouncer)) as gw, Workers(gw) as workers:
        workers.start("pooled-a", concurrency=4)
        workers.start("pooled-b", concurrency=4)
        tasks = [mock_task(f"t{i}") for i in range(12)]
        tasks.append(mock_task("join", deps=[f"t{i}" for i in range(12)]))
        wf = apply(gw, {"id": "pgbouncer-dag", "concurrency": 8, "tasks": tasks})
        runs = [start_run(gw, wf) for _ in range(6)]
        assert [wait_run(gw, r, 60)["status"] for r in runs] == ["succeeded"] * 6
        assert gw.coordinator_active(), "the coordinator leads on its direct session"
        log = gw.log_path.read_text()
    # The gateway's transactions went through PgBouncer (its totals are updated every second): the 6 run starts,
    # the 2 registrations and the 78 tasks' claims and completions (grouped: fewer calls than tasks) at least.
    wait_until(lambda: transactions(bouncer, dbname) - before >= 6 + 2 + 78 // 4, 5, 0.2, "PgBouncer's count")
    assert "prepared statement" not in log and "unsupported startup parameter" not in log, log[-3000:]
    assert "behind PgBouncer:" not in log, "the pooled connections have the gateway's settings (connect_query)"
    with psycopg.connect(db_dsn, row_factory=dict_row) as c:
        assert c.execute("SELECT count(*) AS n FROM awp.check_invariants()").fetchone() == {"n": 0}


def test_a_setting_the_pooled_connections_lack_is_named(db_dsn: str, bouncer: int) -> None:
    with serve(db_dsn, env=pooled_env(db_dsn, bouncer), args=["--lock-timeout-ms", "1234"]) as gw:
        wait_until(lambda: "behind PgBouncer:" in gw.log_path.read_text(), 10, 0.1, "the settings warning")
        log = gw.log_path.read_text()
    assert "lock_timeout is '2000', the gateway's requests expect '1234'" in log, log[-2000:]


def test_pgbouncer_needs_a_direct_session(db_dsn: str, bouncer: int) -> None:
    env: dict[str, Any] = {k: v for k, v in pooled_env(db_dsn, bouncer).items() if k != "AWP_DIRECT_DATABASE_URL"}
    res = subprocess.run(
        [sys.executable, "-m", "awp", "serve", "--port", "0"],
        env={**_base_env(), **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr
    assert "--pgbouncer needs --direct-database-url" in res.stderr, res.stderr


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AWP_")} | {"PYTHONPATH": str(REPO / "python")}
