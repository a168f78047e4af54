"""The first coordinator pass after an outage (a takeover after a gap longer than a heartbeat interval) marks every
lease live at the previous pass ``uncounted = outage`` (docs/protocol.md, Lease recovery), also one that another
transaction holds at that moment.

As the database comes back, that holder is most often a heartbeat renewing or dropping the lease. The pass used to
skip such a lease (SKIP LOCKED): left unmarked, it was then reported dropped, kept to its expiry and counted, and a
run with ``max_attempts`` 1 failed for the outage alone (python/tests/faults/test_outages.py, 2 runs in 13 on a
busy machine). Now the pass waits for it, at most 500 ms: the race is made here with a second session holding the
lease's row, and ``pg_blocking_pids`` shows the pass waiting for it.
"""

from __future__ import annotations

import json
import time

import pytest
from sync_support import connect, in_thread, wait_blocked

from awp_testing.cluster import DictConnection, one


def two_leases(db: DictConnection) -> list[str]:
    """Two tasks leased to one worker; then a gap of 20 s since the last pass (the outage)."""
    tasks = [{"key": f"t{i}", "executor": "mock"} for i in range(2)]
    db.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps({"id": "resume", "tasks": tasks})])
    db.execute("SELECT awp.start_run('resume')")
    worker = one(db, "SELECT * FROM awp.register_worker('w', ARRAY['mock'], 2)")
    db.execute("SELECT awp.coordinator_tick()")
    leases = db.execute(
        "SELECT dispatch_id FROM awp.claim_tasks(%s, %s, 2) ORDER BY dispatch_id",
        [worker["worker_id"], worker["session_token"]],
    ).fetchall()
    assert len(leases) == 2
    db.execute("UPDATE awp.settings SET last_tick_at = now() - interval '20 s'")
    return [x["dispatch_id"] for x in leases]


def uncounted(db: DictConnection, ids: list[str]) -> list[str | None]:
    rows = db.execute(
        "SELECT uncounted FROM awp.dispatches WHERE dispatch_id = ANY(%s) ORDER BY dispatch_id", [ids]
    ).fetchall()
    return [r["uncounted"] for r in rows]


def test_the_first_pass_after_an_outage_waits_for_a_lease_another_session_holds(db, db_dsn):
    ids = two_leases(db)
    for _ in range(3):
        with connect(db_dsn) as holder, connect(db_dsn) as coordinator:
            with holder.transaction():  # as a heartbeat holds the lease it renews
                holder.execute("SELECT 1 FROM awp.dispatches WHERE dispatch_id = %s FOR UPDATE", [ids[1]])
                started = time.monotonic()
                call = in_thread(lambda: one(coordinator, "SELECT awp.coordinator_tick(true) AS x")["x"])
                assert wait_blocked(db, coordinator.info.backend_pid, call) == [holder.info.backend_pid]
            held = time.monotonic() - started  # the pass's wait began after `started`: it waited at most this long
            counts = call.result()
        if held < 0.45:  # released within the pass's wait (500 ms)
            break
        # A machine stalled past the wait: the pass may have given up on the lease, as it should. Once more.
        db.execute("UPDATE awp.dispatches SET uncounted = NULL WHERE dispatch_id = ANY(%s)", [ids])
        db.execute("UPDATE awp.settings SET last_tick_at = now() - interval '20 s'")
    else:
        pytest.fail(f"the lease was held {held:.2f} s each time, past the pass's wait")
    assert counts["resumed"] == 2, counts
    assert uncounted(db, ids) == ["outage", "outage"], "the held lease is marked too"


def test_a_lease_held_past_the_wait_is_left_and_the_pass_goes_on(db, db_dsn):
    ids = two_leases(db)
    with connect(db_dsn) as holder, connect(db_dsn) as coordinator, holder.transaction():
        holder.execute("SELECT 1 FROM awp.dispatches WHERE dispatch_id = %s FOR UPDATE", [ids[1]])
        # The pass ends while the row is still held: its wait is bounded.
        counts = in_thread(lambda: one(coordinator, "SELECT awp.coordinator_tick(true) AS x")["x"]).result()
        assert counts["resumed"] == 1, counts
    assert uncounted(db, ids) == ["outage", None]
