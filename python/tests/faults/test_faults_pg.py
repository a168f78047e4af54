"""Fault scenarios 5 and 11 (issue 6): PostgreSQL stopped with ``pg_ctl stop -m immediate`` mid-run, and
``pg_terminate_backend`` on the gateway's connections and on the coordinator's lock connection. They run on
a cluster of their own (never the shared session cluster); its databases keep ``synchronous_commit = on``
so that an immediate stop loses no acknowledged commit (fsync stays off: the OS does not crash here).
"""

from __future__ import annotations

import time

import pytest
from fault_support import (
    HEARTBEAT_MS,
    LEASE_MS,
    assert_clean,
    configure,
    ms,
    query,
    record,
    start_registered,
    task_rows,
    terminate_backends,
    wait_run_db,
    worker_by_name,
)
from worker_support import Workers, apply, mock_task, start_run

from awp.dev.localdb import Cluster
from awp_testing.gateway import serve, wait_until

pytestmark = pytest.mark.slow  # multi-process / long: make test-fast skips it


@pytest.fixture
def dsn(dsn: str) -> str:
    """The test's database of the module's cluster (faults/conftest.py), with the short timings."""
    configure(dsn)
    return dsn


def succeeded(dsn: str, run_id: str) -> int:
    return sum(1 for t in task_rows(dsn, run_id).values() if t["status"] == "succeeded")


def leased(dsn: str, run_id: str) -> list[dict]:
    return query(
        dsn, "SELECT dispatch_id, worker_id FROM awp.dispatches WHERE run_id = %s AND status = 'leased'", (run_id,)
    )


def lock_holder(dsn: str) -> int | None:
    rows = query(
        dsn,
        "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
        "WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()",
    )
    return rows[0]["pid"] if rows else None


# ---- 5. PostgreSQL stopped mid-run and started again ---------------------------------------------------------


def test_database_stop_mid_run_is_survived(cluster: Cluster, dsn: str) -> None:
    down_for = 3.0
    # After the outage the coordinator gives the workers one offline window to heartbeat again: with 150 ms
    # heartbeats and the default 3 of them, 450 ms, shorter than one heartbeat request may take (the worker waits
    # at least 1 s for its answer, python/awp/worker/heartbeats.py). Once, in the faults suite under two CPU burners,
    # a heartbeat timed out (the other worker's got a 503) and both sessions were offline before the next one.
    # 10 of them (1.5 s) keep the relation of the defaults: a window longer than a heartbeat's timeout.
    configure(dsn, offline_after_heartbeats=10)
    with serve(dsn, coordinator_interval_ms=100) as gw, Workers(gw) as workers:
        procs, sessions = start_registered(workers, dsn, ["s5-0", "s5-1"], concurrency=2)
        # Executions longer than a lease: they are still running when the database goes away.
        tasks = [mock_task(f"t{i:02}", max_attempts=3, sleep_ms=2000) for i in range(6)]
        run_id = start_run(gw, apply(gw, {"id": "s5", "concurrency": 4, "tasks": tasks}))
        wait_until(lambda: len(leased(dsn, run_id)) == 4, 20, 0.02, "four leases")
        held = leased(dsn, run_id)
        # The executions are under way: each lease has reached its worker (it is in the worker's log).
        wait_until(
            lambda: all(any(x["dispatch_id"] in w.log() for w in procs) for x in held), 10, 0.02, "leases received"
        )
        busy = [w for w in procs if sessions[w.name] in {x["worker_id"] for x in held}]
        pid = gw.pid
        cluster.stop(mode="immediate")
        stopped = time.monotonic()
        for w in busy:
            w.wait_log("local safety deadline passed; execution cancelled, not completing", timeout=10)
        cancelled = time.monotonic() - stopped
        time.sleep(max(0.0, down_for - (time.monotonic() - stopped)))  # "started again a few seconds later"
        assert gw.alive()
        cluster.start(fsync=False)
        started = time.monotonic()
        wait_until(gw.ready, 30, 0.05, "the gateway to see the database again")
        ready = time.monotonic() - started
        wait_until(gw.coordinator_active, 30, 0.05, "the coordinator to resume")
        coordinating = time.monotonic() - started
        assert wait_run_db(dsn, run_id, 60)["status"] == "succeeded"
        finished = time.monotonic() - started
        assert gw.pid == pid and gw.alive(), "the gateway recovered without a restart"
        for w in procs:
            assert w.alive(), f"{w.name} exited:\n{w.log()[-2000:]}"
            assert worker_by_name(dsn, w.name)["worker_id"] == sessions[w.name]
        # The leases cut off by the outage were never accepted after it: each attempt ended interrupted, or
        # succeeded if its result had been accepted before the stop (the executions take 2 s, so hardly ever).
        outcome = query(
            dsn,
            "SELECT a.status FROM awp.attempts a WHERE a.dispatch_id = ANY(%s)",
            ([x["dispatch_id"] for x in held],),
        )
        assert {x["status"] for x in outcome} <= {"interrupted", "succeeded"}
        interrupted = sum(1 for x in outcome if x["status"] == "interrupted")
    assert_clean(dsn)
    record(
        "05_postgres_immediate_stop",
        lease_ms=LEASE_MS,
        heartbeat_ms=HEARTBEAT_MS,
        database_down_ms=ms(down_for),
        stop_to_workers_cancelled_ms=ms(cancelled),
        start_to_gateway_ready_ms=ms(ready),
        start_to_coordinator_active_ms=ms(coordinating),
        start_to_run_succeeded_ms=ms(finished),
        leases_cut_off=len(held),
        interrupted_attempts=interrupted,
        gateway_restarted=False,
        violations=0,
    )


# ---- 11. pg_terminate_backend on the gateway's connections ------------------------------------------------------


def test_terminated_backends_are_survived(dsn: str) -> None:
    with serve(dsn, coordinator_interval_ms=100) as gw, Workers(gw) as workers:
        for i in range(2):
            workers.start(f"s11-{i}", concurrency=2)
        tasks = [mock_task(f"t{i:02}", max_attempts=3, sleep_ms=150) for i in range(40)]
        run_id = start_run(gw, apply(gw, {"id": "s11", "concurrency": 4, "tasks": tasks}))
        wait_until(lambda: succeeded(dsn, run_id) >= 5, 20, 0.02, "the run under way")

        # Every connection of the gateway: pool, LISTEN and the coordinator's.
        all_terminated = terminate_backends(dsn, "a.application_name = 'awp-gateway'")
        cut = time.monotonic()
        assert all_terminated >= 3
        wait_until(lambda: gw.ready() and lock_holder(dsn), 20, 0.02, "gateway and coordinator back")
        all_back = time.monotonic() - cut

        wait_until(lambda: succeeded(dsn, run_id) >= 20, 30, 0.02, "the run under way again")
        # Only the coordinator's advisory-lock connection.
        old = lock_holder(dsn)
        assert old is not None
        assert terminate_backends(dsn, f"a.pid = {int(old)}") == 1
        cut = time.monotonic()
        wait_until(lambda: (pid := lock_holder(dsn)) is not None and pid != old, 20, 0.01, "a new lock session")
        relocked = time.monotonic() - cut

        assert wait_run_db(dsn, run_id, 60)["status"] == "succeeded"
        assert gw.alive()
        assert gw.coordinator_active()
    assert_clean(dsn)
    retried = query(dsn, "SELECT count(*) AS n FROM awp.attempts WHERE run_id = %s AND attempt > 1", (run_id,))[0]["n"]
    record(
        "11_pg_terminate_backend",
        gateway_connections_terminated=all_terminated,
        all_connections_to_ready_and_coordinating_ms=ms(all_back),
        lock_connection_to_new_lock_session_ms=ms(relocked),
        attempts_retried=retried,
        violations=0,
    )
