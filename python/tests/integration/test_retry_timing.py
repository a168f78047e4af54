"""Retries promoted between passes (AWP issue 41): the coordinator sleeps until the earliest due retry or wait
(awp.next_due_ms) when that is sooner than its interval, so a 200 ms retry starts about 200 ms after the failure,
not at the next regular pass (with the default 500 ms interval it started 1.0-1.5 s late). A real gateway with a
slow 2 s coordinator interval, a real worker."""

from __future__ import annotations

import itertools

import psycopg
from psycopg.rows import dict_row
from worker_support import SHORT_LEASES, Workers, apply, mock_task, start_run, wait_run

from awp_testing.gateway import ServeProcess

INTERVAL_MS = 2000  # the coordinator's regular interval: a retry promoted only by it would wait up to this long
RETRY_MS = 200


GATEWAY_SETTINGS = SHORT_LEASES
GATEWAY_OPTIONS = {"coordinator_interval_ms": INTERVAL_MS}


def test_a_due_retry_starts_soon_after_its_interval(db_dsn: str, gw: ServeProcess) -> None:
    task = mock_task("flaky", max_attempts=4, fail_attempts=3)
    task["retry"] = {"max_attempts": 4, "interval_ms": RETRY_MS, "backoff": 1, "jitter": 0}
    wf = apply(gw, {"id": "retry-timing", "tasks": [task]})
    with Workers(gw) as ws:
        w = ws.start("retry-timing", concurrency=1, wait_ms=5000)
        w.wait_log("registered as")
        run_id = start_run(gw, wf)
        assert wait_run(gw, run_id, 20)["status"] == "succeeded"
    with psycopg.connect(db_dsn, row_factory=dict_row) as c:
        rows = c.execute(
            "SELECT attempt, status, started_at, finished_at FROM awp.attempts WHERE run_id = %s ORDER BY attempt",
            (run_id,),
        ).fetchall()
    assert [r["status"] for r in rows] == ["failed", "failed", "failed", "succeeded"]
    gaps = [(b["started_at"] - a["finished_at"]).total_seconds() for a, b in itertools.pairwise(rows)]
    print("failure -> next attempt:", ", ".join(f"{g * 1000:.0f} ms" for g in gaps))
    assert all(RETRY_MS / 1000 <= g < 1.0 for g in gaps), gaps  # ~0.21 s here; 0.2-2.2 s with a pass every 2 s
