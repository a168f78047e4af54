"""Races of the worker protocol, proven with several real connections to one PostgreSQL.

pgTAP covers each function's branches inside one session; what only concurrency can show lives here:
a dispatch is never handed out twice, the reaper never expires a lease renewed under its nose, a
complete and a cancel (or a reap) never both win, limits hold under concurrent claims, and a mixed
load never deadlocks.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sync_support import connect, in_thread, wait_blocked, wait_db_time_past

from awp_testing.cluster import DictConnection, one


def make_run(c: DictConnection, n: int, concurrency: int, wid: str = "races", **task: Any) -> str:
    tasks = [{"key": f"t{i}", "executor": "mock", **task} for i in range(n)]
    c.execute(
        "SELECT * FROM awp.create_workflow_version(%s)",
        [json.dumps({"id": wid, "concurrency": concurrency, "tasks": tasks})],
    )
    return one(c, "SELECT awp.start_run(%s) AS id", [wid])["id"]


def register(c: DictConnection, name: str, max_concurrency: int) -> tuple[str, str]:
    row = one(
        c, "SELECT worker_id, session_token FROM awp.register_worker(%s, ARRAY['mock'], %s)", [name, max_concurrency]
    )
    return row["worker_id"], row["session_token"]


def claim(c: DictConnection, worker: tuple[str, str], slots: int) -> list[dict[str, Any]]:
    return c.execute("SELECT * FROM awp.claim_tasks(%s, %s, %s)", [*worker, slots]).fetchall()


def complete(c: DictConnection, worker: tuple[str, str], lease: dict[str, Any], kind: str = "success") -> bool:
    row = one(
        c,
        "SELECT awp.complete_task(%s, %s, %s, %s, %s) AS applied",
        [*worker, lease["dispatch_id"], lease["lease_token"], json.dumps({"kind": kind})],
    )
    return row["applied"]


def heartbeat(c: DictConnection, worker: tuple[str, str], leases: list[dict[str, Any]]) -> dict[str, str]:
    body = json.dumps([{"dispatch_id": x["dispatch_id"], "lease_token": x["lease_token"]} for x in leases])
    rows = c.execute("SELECT * FROM awp.heartbeat(%s, %s, %s)", [*worker, body]).fetchall()
    return {r["dispatch_id"]: r["status"] for r in rows}


def tick(c: DictConnection) -> dict[str, int]:
    return one(c, "SELECT awp.coordinator_tick() AS t")["t"]


def run_status(c: DictConnection, run_id: str) -> str:
    return one(c, "SELECT status FROM awp.get_run(%s)", [run_id])["status"]


def assert_invariants(c: DictConnection) -> None:
    """awp.check_invariants() finds nothing: events contiguous and matching statuses, limits held, …"""
    assert c.execute("SELECT * FROM awp.check_invariants()").fetchall() == []


def in_threads(n: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def wrapped(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # re-raised in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


def test_concurrent_claims_never_hand_out_one_dispatch_twice(db, db_dsn):
    db.execute("SELECT awp.configure(dispatch_limit => 300)")
    run_id = make_run(db, 200, concurrency=200)
    workers = [register(db, f"w{i}", 50) for i in range(8)]
    assert tick(db)["dispatched"] == 200
    got: list[list[str]] = [[] for _ in workers]

    def claimer(i: int) -> None:
        with connect(db_dsn) as c:
            while len(got[i]) < 50:
                leases = claim(c, workers[i], 5)
                if not leases:
                    return
                got[i].extend(x["dispatch_id"] for x in leases)

    in_threads(len(workers), claimer)
    ids = [d for g in got for d in g]
    assert len(ids) == 200
    assert len(set(ids)) == 200
    row = db.execute(
        "SELECT count(*) FILTER (WHERE status = 'leased') AS leased, count(DISTINCT fencing_token) AS fences"
        " FROM awp.dispatches WHERE run_id = %s",
        [run_id],
    ).fetchone()
    assert row == {"leased": 200, "fences": 200}
    assert db.execute("SELECT count(*) AS n FROM awp.attempts WHERE run_id = %s", [run_id]).fetchone()["n"] == 200
    assert_invariants(db)


def set_lease_end(c: DictConnection, lease: dict[str, Any], after: str) -> Any:
    """Move a lease's expiry to ``clock_timestamp() + after`` (a superuser shortcut for "time passes"); returns
    the new expiry. Waiting for the database clock to pass it (sync_support.wait_db_time_past) then takes
    milliseconds, not a lease."""
    return one(
        c,
        "UPDATE awp.dispatches SET lease_expires_at = clock_timestamp() + %s::interval WHERE dispatch_id = %s"
        " RETURNING lease_expires_at",
        [after, lease["dispatch_id"]],
    )["lease_expires_at"]


def committed_expired(c: DictConnection, lease: dict[str, Any]) -> bool:
    """What the reaper's candidate query sees now: the committed lease is leased and past its expiry."""
    return one(
        c,
        "SELECT status = 'leased' AND lease_expires_at <= clock_timestamp() AS x FROM awp.dispatches"
        " WHERE dispatch_id = %s",
        [lease["dispatch_id"]],
    )["x"]


def reap(c: DictConnection) -> int:
    return one(c, "SELECT awp.reap_expired_leases() AS n")["n"]


def test_lease_renewed_after_the_reapers_candidate_read_is_not_expired(db, db_dsn):
    run_id = make_run(db, 1, concurrency=1)
    worker = register(db, "w", 1)
    tick(db)
    [lease] = claim(db, worker, 1)
    old_end = set_lease_end(db, lease, "100 ms")
    with connect(db_dsn) as hb, connect(db_dsn) as reaper:
        with hb.transaction():
            assert heartbeat(hb, worker, [lease]) == {lease["dispatch_id"]: "renewed"}  # to now + 15 s, uncommitted
            wait_db_time_past(db, old_end)  # the committed expiry passes while the renewal is not yet committed
            assert committed_expired(db, lease), "the reaper's candidate query does pick this lease"
            # ... but the heartbeat holds it: skipped (SKIP LOCKED), not expired.
            assert reap(reaper) == 0
        # Committed renewal: the lease is valid again (for 15 s), nothing to reap.
        assert not committed_expired(db, lease)
        assert reap(reaper) == 0
    assert complete(db, worker, lease)
    assert run_status(db, run_id) == "succeeded"


def test_heartbeat_does_not_wait_behind_a_reaper_holding_the_lease(db, db_dsn):
    make_run(db, 1, concurrency=1, retry={"max_attempts": 2, "interval_ms": 0})
    worker = register(db, "w", 1)
    tick(db)
    [lease] = claim(db, worker, 1)
    wait_db_time_past(db, set_lease_end(db, lease, "0 ms"))
    with connect(db_dsn) as reaper, connect(db_dsn) as hb:
        # If the heartbeat waited for the reaper's row lock it would wait for this very thread, which holds
        # the reaper's transaction open: a self-deadlock that only the statement timeout (a hang bound) ends.
        hb.execute("SET statement_timeout = '30s'")
        with reaper.transaction():
            assert reap(reaper) == 1
            assert heartbeat(hb, worker, [lease]) == {lease["dispatch_id"]: "revoked"}
    with pytest.raises(psycopg.Error) as err:
        complete(db, worker, lease)
    assert err.value.sqlstate == "AWLST"


@pytest.mark.parametrize("first", ["complete", "reaper"])
def test_complete_and_reaper_never_both_win(db, db_dsn, first):
    run_id = make_run(db, 1, concurrency=1, retry={"max_attempts": 3, "interval_ms": 0})
    worker = register(db, "w", 1)
    tick(db)
    [lease] = claim(db, worker, 1)

    def do_complete(c: DictConnection) -> Any:
        try:
            return complete(c, worker, lease)
        except psycopg.Error as exc:
            return exc.sqlstate

    with connect(db_dsn) as a, connect(db_dsn) as b:
        if first == "complete":
            # Complete holds Run and Dispatch; the lease expires meanwhile; the reaper must skip it.
            end = set_lease_end(db, lease, "200 ms")
            with a.transaction():
                assert do_complete(a) is True
                wait_db_time_past(db, end)
                assert committed_expired(db, lease), "the reaper's candidate query does pick this lease"
                assert reap(b) == 0
            assert reap(b) == 0
            assert run_status(db, run_id) == "succeeded"
        else:
            wait_db_time_past(db, set_lease_end(db, lease, "0 ms"))
            with a.transaction():
                assert reap(a) == 1
                call = in_thread(lambda: do_complete(b))
                # The complete now waits for the run lock the reaper holds (seen, not assumed after a sleep).
                assert wait_blocked(db, b.info.backend_pid, call) == [a.info.backend_pid]
            assert call.result() == "AWLST"
            attempts = db.execute("SELECT status FROM awp.task_attempts(%s, 't0')", [run_id]).fetchall()
            assert [x["status"] for x in attempts] == ["interrupted"]
    assert_invariants(db)


def race_cancel_against_complete(dsn: str, run_id: str, worker: tuple[str, str], lease: dict[str, Any]) -> Any:
    """Cancel (and converge) and complete one lease at the same moment; the complete's answer or SQLSTATE."""
    barrier = threading.Barrier(2)
    result: dict[str, Any] = {}

    def racer(k: int) -> None:
        with connect(dsn) as c:
            barrier.wait()
            if k == 0:
                c.execute("SELECT * FROM awp.request_cancel(%s)", [run_id])
                c.execute("SELECT awp.converge_cancellations()")
                return
            try:
                result["complete"] = complete(c, worker, lease)
            except psycopg.Error as exc:
                result["complete"] = exc.sqlstate

    in_threads(2, racer)
    return result["complete"]


def cancel_and_converge(c: DictConnection, run_id: str) -> None:
    c.execute("SELECT * FROM awp.request_cancel(%s)", [run_id])
    c.execute("SELECT awp.converge_cancellations()")


@pytest.mark.parametrize("first", ["cancel", "complete"])
def test_cancel_and_complete_the_one_that_locks_the_run_first_wins(db, db_dsn, first):
    run_id = make_run(db, 1, concurrency=1, wid=f"cancel-first-{first}")
    worker = register(db, "w", 1)
    tick(db)
    [lease] = claim(db, worker, 1)

    def do_complete(c: DictConnection) -> Any:
        try:
            return complete(c, worker, lease)
        except psycopg.Error as exc:
            return exc.sqlstate

    with connect(db_dsn) as a, connect(db_dsn) as b:
        with a.transaction():
            if first == "cancel":
                cancel_and_converge(a, run_id)
                call = in_thread(lambda: do_complete(b))
            else:
                assert do_complete(a) is True
                call = in_thread(lambda: cancel_and_converge(b, run_id))
            # The second one is seen waiting for the first one's run lock before the first commits.
            assert wait_blocked(db, b.info.backend_pid, call) == [a.info.backend_pid]
        answer = call.result()
    tick(db)
    task = db.execute("SELECT status FROM awp.run_tasks(%s)", [run_id]).fetchone()["status"]
    if first == "cancel":
        assert answer == "AWLST"
        assert (task, run_status(db, run_id)) == ("canceled", "canceled")
    else:
        assert (task, run_status(db, run_id)) == ("succeeded", "succeeded"), (
            "a cancel of a finished run changes nothing"
        )
    assert_invariants(db)


def test_cancel_and_complete_exactly_one_wins(db, db_dsn):
    """Free races (no ordering imposed; the test above forces each order): whichever wins, exactly one does."""
    for i in range(8):
        run_id = make_run(db, 1, concurrency=1, wid=f"cancel-race-{i}")
        worker = register(db, f"w{i}", 1)
        tick(db)
        [lease] = claim(db, worker, 1)
        outcome = race_cancel_against_complete(db_dsn, run_id, worker, lease)
        tick(db)
        task = db.execute("SELECT status FROM awp.run_tasks(%s)", [run_id]).fetchone()["status"]
        run = run_status(db, run_id)
        if outcome is True:
            assert (task, run) == ("succeeded", "succeeded")
        else:
            assert outcome == "AWLST"
            assert (task, run) == ("canceled", "canceled")
    assert_invariants(db)


def sample_limits(c: DictConnection, dispatch_limit: int) -> list[str]:
    """Every limit of docs/protocol.md, rule 8 that is exceeded right now (an empty list when all hold)."""
    bad = []
    row = one(c, "SELECT count(*) AS n FROM awp.dispatches WHERE status IN ('pending', 'leased')")
    if row["n"] > dispatch_limit:
        bad.append(f"global {row['n']} > {dispatch_limit}")
    for r in c.execute(
        "SELECT w.worker_id, w.max_concurrency, count(d.*) AS n FROM awp.workers w"
        " JOIN awp.dispatches d ON d.worker_id = w.worker_id AND d.status = 'leased'"
        " GROUP BY 1, 2 HAVING count(d.*) > w.max_concurrency"
    ):
        bad.append(f"worker {r}")
    for r in c.execute(
        "SELECT r.run_id, r.concurrency, count(t.*) AS n FROM awp.runs r"
        " JOIN awp.tasks t ON t.run_id = r.run_id AND t.status IN ('queued', 'running')"
        " GROUP BY 1, 2 HAVING count(t.*) > r.concurrency"
    ):
        bad.append(f"run {r}")
    return bad


@pytest.mark.slow
def test_claims_from_many_workers_never_exceed_any_limit(db, db_dsn):
    db.execute("SELECT awp.configure(dispatch_limit => 7)")
    runs = [make_run(db, 40, concurrency=3, wid=f"limits-{i}") for i in range(3)]
    workers = [register(db, f"w{i}", 2) for i in range(6)]
    stop = threading.Event()
    violations: list[str] = []
    samples = [0]

    def actor(i: int) -> None:
        with connect(db_dsn) as c:
            if i == 0:  # the coordinator
                while not stop.is_set():
                    tick(c)
                return
            if i == 1:  # the sampler (an SQL error fails the test: in_threads re-raises it)
                while not stop.is_set():
                    with c.transaction():
                        c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        violations.extend(sample_limits(c, 7))
                        violations.extend(str(r) for r in c.execute("SELECT * FROM awp.check_invariants()"))
                    samples[0] += 1
                return
            worker = workers[i - 2]
            held: list[dict[str, Any]] = []
            while not stop.is_set():
                free = 2 - len(held)
                if free:
                    held += claim(c, worker, free)
                if held:
                    complete(c, worker, held.pop(0))

    threading.Timer(4.0, stop.set).start()
    in_threads(len(workers) + 2, actor)
    assert samples[0] > 0, "the sampler checked nothing"
    assert violations == []
    finish_runs(db, runs, workers, 2)


def finish_runs(db: DictConnection, runs: list[str], workers: list[tuple[str, str]], slots: int) -> None:
    """After a race: the coordinator and the workers (``slots`` each) in this thread until every run succeeded, then
    the checker finds nothing."""
    for _ in range(600):
        if all(run_status(db, r) == "succeeded" for r in runs):
            break
        tick(db)
        for w in workers:
            held = one(db, "SELECT active_leases FROM awp.get_worker(%s)", [w[0]])["active_leases"]
            if held < slots:
                for lease in claim(db, w, slots - held):
                    complete(db, w, lease)
    assert [run_status(db, r) for r in runs] == ["succeeded"] * len(runs)
    assert_invariants(db)


def complete_and_claim(c: DictConnection, worker: tuple[str, str], lease: dict[str, Any]) -> list[dict[str, Any]]:
    return c.execute(
        "SELECT * FROM awp.complete_and_claim(%s, %s, %s, %s, %s, 1)",
        [*worker, lease["dispatch_id"], lease["lease_token"], json.dumps({"kind": "success"})],
    ).fetchall()


def test_rate_limits_hold_under_eight_concurrent_claimers(db, db_dsn):
    """docs/limits.md: max_in_flight per bucket holds at every instant while 8 workers claim and complete (and
    refill through the claim on complete) concurrently with coordinator passes, across runs and keys."""
    db.execute("SELECT awp.configure(dispatch_limit => 100)")
    db.execute("SELECT * FROM awp.set_limit('api', 5)")
    db.execute("SELECT * FROM awp.set_limit('tenant', 2)")
    # Many runs share the bucket: a run's own lock serialises its dispatches, so only dispatches into different runs
    # race for the bucket's last unit (the buckets' advisory locks are what stops them).
    runs = [make_run(db, 8, concurrency=10, wid=f"rl-{i}", limits=["api"]) for i in range(8)]
    # Tasks without limits too: a refill after one of them takes a task with limits without freeing a unit of the
    # bucket, so such refills on several workers race for the same last unit.
    runs += [make_run(db, 40, concurrency=20, wid=f"rl-free-{i}") for i in range(2)]
    keyed = {"name": "tenant", "key_from": ["run_input", "t"]}
    db.execute(
        "SELECT * FROM awp.create_workflow_version(%s)",
        [
            json.dumps(
                {
                    "id": "rl-keyed",
                    "concurrency": 10,
                    "tasks": [{"key": f"k{i}", "executor": "mock", "limits": [keyed]} for i in range(20)],
                }
            )
        ],
    )
    runs += [
        one(db, "SELECT awp.start_run('rl-keyed', NULL, NULL, %s) AS id", [json.dumps({"t": t})])["id"]
        for t in ("a", "b")
    ]
    workers = [register(db, f"w{i}", 3) for i in range(8)]
    limits = {"api": 5, "tenant=a": 2, "tenant=b": 2}
    stop = threading.Event()
    violations: list[str] = []
    peaks = dict.fromkeys(limits, 0)
    samples = [0]

    def actor(i: int) -> None:
        with connect(db_dsn) as c:
            if i == 0:  # the coordinator, now and then: most dispatches are the workers' refills, which race
                while not stop.is_set():
                    tick(c)
                    time.sleep(0.05)
                return
            if i == 1:  # the sampler: one snapshot per sample, cheap (the checker every 20th)
                while not stop.is_set():
                    with c.transaction():
                        c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        for bucket, most in limits.items():
                            n = one(
                                c,
                                "SELECT count(*) AS n FROM awp.tasks WHERE status IN ('queued', 'running')"
                                " AND limit_buckets @> ARRAY[%s]",
                                [bucket],
                            )["n"]
                            peaks[bucket] = max(peaks[bucket], n)
                            if n > most:
                                violations.append(f"{bucket}: {n} in flight > {most}")
                        if samples[0] % 20 == 0:
                            violations.extend(str(r) for r in c.execute("SELECT * FROM awp.check_invariants()"))
                    samples[0] += 1
                return
            worker = workers[i - 2]
            held: list[dict[str, Any]] = []
            while not stop.is_set():
                if len(held) < 3:
                    held += claim(c, worker, 3 - len(held))
                if held:
                    time.sleep(0.002)  # a lease held for a moment: an excess would last long enough to be sampled
                    held += complete_and_claim(c, worker, held.pop(0))
            for lease in held:  # what it holds at the end is completed (no lease left to expire)
                complete(c, worker, lease)

    threading.Timer(4.0, stop.set).start()
    in_threads(len(workers) + 2, actor)
    assert samples[0] > 0, "the sampler checked nothing"
    assert violations == []
    assert peaks["api"] == 5, f"the api limit was never used up: {peaks}"
    finish_runs(db, runs, workers, 3)


def test_a_bucket_busy_in_another_transaction_is_skipped_not_counted_twice(db, db_dsn):
    """Two dispatches into one bucket at once (db/functions/_rate_limits.sql): while one transaction has spent the
    bucket's last unit and not committed, another sees the bucket busy (its advisory lock) and skips it, rather than
    counting the uncommitted dispatch out and spending the same unit again."""
    runs = [make_run(db, 1, concurrency=1, wid=f"solo-{i}", limits=["solo"]) for i in range(2)]
    register(db, "solo-w", 4)
    db.execute("SELECT * FROM awp.set_limit('solo', 1)")
    with connect(db_dsn) as first, connect(db_dsn) as second:
        with first.transaction():
            # One dispatch (n 1): the first transaction then holds only that run, the other run is free to take.
            got = one(first, "SELECT created FROM awp._dispatch_limited('{\"mock\": 4}', 1)")["created"]
            assert got == 1, "the first transaction takes the bucket's one unit"
            again = one(second, "SELECT created FROM awp._dispatch_limited('{\"mock\": 4}', 4)")["created"]
            assert again == 0, "the second saw the bucket busy and dispatched nothing"
        in_flight = one(
            db,
            "SELECT count(*) AS n FROM awp.tasks WHERE status IN ('queued', 'running') AND limit_buckets @> '{solo}'",
        )["n"]
        assert in_flight == 1
    waits = [one(db, "SELECT reason FROM awp.run_waits(%s)", [r]) for r in runs if run_status(db, r) == "pending"]
    assert [w["reason"] for w in waits] == ["rate_limited"], "the other run's task waits for the unit"
    assert_invariants(db)


@pytest.mark.slow
def test_mixed_concurrent_load_never_deadlocks(db, db_dsn):
    # Leases of 400 ms keep the reaper busy; a worker goes offline only after 500 ms of silence (10 x 50 ms):
    # this test looks for deadlocks, and on 2 busy cores one thread can be descheduled for 150 ms (the default
    # 3 heartbeats), which is a worker going offline, not a deadlock.
    db.execute(
        "SELECT awp.configure(dispatch_limit => 50, heartbeat_interval_ms => 50, lease_duration_ms => 400,"
        " offline_after_heartbeats => 10)"
    )
    for i in range(4):
        make_run(db, 60, concurrency=10, wid=f"mixed-{i}", retry={"max_attempts": 3, "interval_ms": 0})
    workers = [register(db, f"w{i}", 4) for i in range(5)]
    stop = threading.Event()
    failures: list[str] = []

    def actor(i: int) -> None:
        rnd = random.Random(i)
        with connect(db_dsn) as c:
            worker = workers[i % len(workers)]
            held: list[dict[str, Any]] = []
            while not stop.is_set():
                try:
                    if i == 0:
                        tick(c)
                    elif i == 1 and rnd.random() < 0.02:
                        victim = c.execute(
                            "SELECT run_id FROM awp.runs WHERE status = 'running' ORDER BY random() LIMIT 1"
                        ).fetchone()
                        if victim:
                            c.execute("SELECT * FROM awp.request_cancel(%s)", [victim["run_id"]])
                    else:
                        if len(held) < 2:
                            held += claim(c, worker, 1)
                        if held and rnd.random() < 0.5:
                            heartbeat(c, worker, held)
                        if held and rnd.random() < 0.5:
                            lease = held.pop(rnd.randrange(len(held)))
                            kind = rnd.choice(["success", "success", "temporary_failure"])
                            try:
                                complete(c, worker, lease, kind)
                            except psycopg.Error as exc:
                                if exc.sqlstate != "AWLST":
                                    raise
                except psycopg.Error as exc:
                    if exc.sqlstate in ("AWCAP",):
                        held.clear()
                        continue
                    failures.append(f"{exc.sqlstate}: {exc}")
                    return

    threading.Timer(5.0, stop.set).start()
    in_threads(7, actor)
    assert failures == []
    assert_invariants(db)
