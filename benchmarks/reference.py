"""The machine's reference: the minimal SKIP LOCKED claim + complete loop in plain SQL, run by pgbench.

A separate table ``bench_ref.jobs`` in the benchmark database holds ``rows`` ready jobs. Each pgbench
"transaction" is one job, done in two transactions like a real worker does:

    BEGIN; UPDATE … WHERE id = (SELECT id … WHERE status = 'ready' ORDER BY id LIMIT 1
                                FOR UPDATE SKIP LOCKED) RETURNING id; COMMIT;      -- claim
    UPDATE … SET status = 'done' WHERE id = :id;                                   -- complete

so its rate is what this PostgreSQL (fsync on, same cluster) can do for a queue with no HTTP, no lease,
no events and no Python: AWP's throughput is printed as a fraction of it.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from awp.dev.pgbin import pg_bin
from awp_testing.cluster import libpq_env, one

SCHEMA = """
DROP SCHEMA IF EXISTS bench_ref CASCADE;
CREATE SCHEMA bench_ref;
CREATE TABLE bench_ref.jobs (
  id          bigserial PRIMARY KEY,
  status      text NOT NULL DEFAULT 'ready',
  payload     jsonb NOT NULL DEFAULT '{}',
  claimed_at  timestamptz,
  finished_at timestamptz
) WITH (fillfactor = 80);
CREATE INDEX jobs_ready_idx ON bench_ref.jobs (id) WHERE status = 'ready';
"""

SCRIPT = r"""BEGIN;
UPDATE bench_ref.jobs SET status = 'running', claimed_at = now()
 WHERE id = (SELECT id FROM bench_ref.jobs WHERE status = 'ready' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id AS job_id \gset
COMMIT;
UPDATE bench_ref.jobs SET status = 'done', finished_at = now() WHERE id = :job_id;
"""


def prepare(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        c.execute("INSERT INTO bench_ref.jobs (payload) SELECT '{\"sleep_ms\": 0}' FROM generate_series(1, %s)", [rows])
        c.execute("VACUUM ANALYZE bench_ref.jobs")


def drop(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP SCHEMA IF EXISTS bench_ref CASCADE")


def run_pgbench(dsn: str, clients: int, seconds: float, rows: int) -> dict[str, float]:
    """One pgbench run on a fresh jobs table; jobs/s from the table itself (done rows / their time span)."""
    prepare(dsn, rows)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="awp-bench-ref-", delete=False) as f:
        f.write(SCRIPT)
        script = Path(f.name)
    try:
        cmd = [
            pg_bin("pgbench"),
            "-n",  # no vacuum of pgbench's own tables (there are none)
            "-M",
            "prepared",
            "-f",
            str(script),
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-T",
            str(max(1, round(seconds))),
        ]
        started = time.monotonic()
        res = subprocess.run(cmd, env={**os.environ, **libpq_env(dsn)}, capture_output=True, text=True)
        wall = time.monotonic() - started
        if res.returncode != 0:
            raise RuntimeError(f"pgbench failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", res.stdout)
        with psycopg.connect(dsn) as c:
            done, span = one(
                c,
                "SELECT count(*), extract(epoch FROM max(finished_at) - min(claimed_at))"
                " FROM bench_ref.jobs WHERE status = 'done'",
            )
        if done >= rows:
            raise RuntimeError(f"the reference ran out of jobs ({rows}): raise rows")
        return {
            "clients": clients,
            "jobs": int(done),
            "tasks_per_s": float(done) / float(span) if span else 0.0,
            "pgbench_tps": float(m.group(1)) if m else 0.0,
            "wall_s": wall,
        }
    finally:
        script.unlink(missing_ok=True)
