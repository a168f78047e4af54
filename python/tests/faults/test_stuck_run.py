"""One stuck run never starves the gateway (docs/operations.md, Timeouts and pools).

A transaction holds one run (its row ``FOR UPDATE``, or its advisory lock, as a DBA in ``psql`` or a slow
statement would) while two dozen completions of that run pile up in a real ``awp serve`` with a pool of the
default size. Meanwhile a worker of another run heartbeats: every heartbeat answers well under a second (its
own pool), and its completion lands. The piled-up completions answer ``503 unavailable`` with ``Retry-After``
once ``lock_timeout`` has passed; retried after the release they all apply, and nothing is lost.

Also: every request connection carries the timeouts; a wrong lease token is refused without waiting for the
run; a claim gives up a stuck run after a bounded wait (so its worker's heartbeats are not held back); a real
worker retries a completion answered 503 and the task succeeds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest
from sync_support import gateway_lock_waiters, in_thread, wait_blocked
from worker_support import Workers, apply, mock_task, start_run, wait_run

from awp.server.db import Database
from awp_testing.cluster import one
from awp_testing.gateway import PROTOCOL, ServeProcess, bearer, serve, wait_until

PILE = 24  # completions of the stuck run sent at once: more than the default request pool (10)
ROUTES = ("complete", "complete_and_claim", "completions")  # the three ways a worker reports a result
LOCK_TIMEOUT_S = 2.0  # the default --lock-timeout-ms


# Long leases and a long offline window: the hand workers below do not heartbeat all the time.
GATEWAY_SETTINGS = {"lease_duration_ms": 60000, "heartbeat_interval_ms": 20000}
GATEWAY_OPTIONS = {"coordinator_interval_ms": 200}  # default pool sizes and timeouts


class HandWorker:
    """A worker speaking the protocol by hand (httpx, one request per call)."""

    def __init__(self, gw: ServeProcess, kinds: list[str], slots: int) -> None:
        r = httpx.post(
            gw.api("/workers/register"),
            json={"executor_kinds": kinds, "max_concurrency": slots},
            headers=gw.auth("bootstrap"),
            timeout=10,
        )
        assert r.status_code == 201, r.text
        self.gw, self.id = gw, r.json()["worker_id"]
        self.headers = {**bearer(r.json()["session_token"]), **PROTOCOL}

    def post(self, path: str, body: object, timeout: float = 60) -> httpx.Response:
        return httpx.post(self.gw.api(f"/workers/{self.id}{path}"), json=body, headers=self.headers, timeout=timeout)

    def claim_all(self, run_id: str, n: int) -> list[dict[str, Any]]:
        leases: list[dict[str, Any]] = []

        def more() -> bool:
            r = self.post("/claims", {"slots": n - len(leases), "wait_ms": 1000})
            assert r.status_code == 200, r.text
            leases.extend(x for x in r.json()["leases"] if x["run_id"] == run_id)
            return len(leases) == n

        wait_until(more, 20, 0.01, f"{n} leases of {run_id}")
        return leases

    def heartbeat(self, leases: list[dict[str, Any]]) -> httpx.Response:
        body = {"leases": [{"dispatch_id": x["dispatch_id"], "lease_token": x["lease_token"]} for x in leases]}
        return self.post("/heartbeat", body, timeout=30)

    def complete(self, lease: dict[str, Any], route: str = "complete") -> httpx.Response:
        """Report a success by one of ROUTES; the answer of /completions is turned into complete's shape."""
        result = {"kind": "success", "output": {"k": lease["task_key"]}}
        if route == "completions":
            item = {"dispatch_id": lease["dispatch_id"], "lease_token": lease["lease_token"], "result": result}
            r = self.post("/completions", {"results": [item], "claim_slots": 1})
            if r.status_code == 200:
                answer = r.json()["results"][0]
                assert answer.get("applied") is True, r.text
            return r
        body: dict[str, Any] = {"lease_token": lease["lease_token"], "result": result}
        if route == "complete_and_claim":
            body["claim_slots"] = 1
        return self.post(f"/leases/{lease['dispatch_id']}/complete", body)

    def complete_until_applied(self, lease: dict[str, Any], deadline: float, route: str = "complete") -> httpx.Response:
        """As a worker does: a 503 is sent again (after a short pause here) until the answer is final."""
        while True:
            r = self.complete(lease, route)
            if r.status_code != 503 or time.monotonic() > deadline:
                return r
            time.sleep(0.2)


@dataclass
class Observed:
    other_beats: list[tuple[float, int]] = field(default_factory=list)  # (seconds, status)
    stuck_beats: list[tuple[float, int]] = field(default_factory=list)  # the stuck run's worker's own
    refused_beats: list[str] = field(default_factory=list)  # the body of each heartbeat not answered 200
    completes: list[tuple[float, httpx.Response]] = field(default_factory=list)
    other_complete: tuple[float, httpx.Response] | None = None
    readiness: list[dict[str, Any]] = field(default_factory=list)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    t0 = time.monotonic()
    value = fn(*args)
    return time.monotonic() - t0, value


def pile_up(gw: ServeProcess, db_dsn: str, name: str, hold_sql: str) -> Observed:
    """Lock one run with ``hold_sql``, pile ``PILE`` completions on it (by all three routes), heartbeat and
    complete another run's lease meanwhile; release once every piled completion has answered."""
    stuck_run = start_run(
        gw, apply(gw, {"id": f"{name}-stuck", "concurrency": PILE, "tasks": [mock_task(f"t{i}") for i in range(PILE)]})
    )
    other_run = start_run(
        gw, apply(gw, {"id": f"{name}-other", "tasks": [{"key": "only", "executor": "python", "action": "x"}]})
    )
    stuck_worker = HandWorker(gw, ["mock"], PILE)
    other_worker = HandWorker(gw, ["python"], 1)
    stuck_leases = stuck_worker.claim_all(stuck_run, PILE)
    [other_lease] = other_worker.claim_all(other_run, 1)
    routes = [ROUTES[i % len(ROUTES)] for i in range(PILE)]
    seen = Observed()
    with psycopg.connect(db_dsn, autocommit=True) as holder, psycopg.connect(db_dsn, autocommit=True) as probe:
        holder.execute("BEGIN")
        holder.execute(hold_sql, [stuck_run])
        started = time.monotonic()
        pool = concurrent.futures.ThreadPoolExecutor(PILE)
        piled = [pool.submit(timed, stuck_worker.complete, x, r) for x, r in zip(stuck_leases, routes, strict=True)]
        # The pile is real: gateway backends wait for the held lock.
        wait_until(
            lambda: gateway_lock_waiters(probe) >= 5,
            15,
            0.02,
            "completions waiting for the stuck run",
        )

        def other_complete() -> None:
            seen.other_complete = timed(other_worker.complete_until_applied, other_lease, time.monotonic() + 60)

        other = threading.Thread(target=other_complete, daemon=True)
        other.start()
        while time.monotonic() < started + 30:
            if len(seen.readiness) < 3:  # first, while the pile surely fills the request pool
                ready = httpx.get(gw.url("/health/ready"), timeout=10)
                seen.readiness.append({"http": ready.status_code, **ready.json()})
            for log, hand, leases in (
                (seen.other_beats, other_worker, [other_lease]),
                (seen.stuck_beats, stuck_worker, stuck_leases),
            ):
                took, r = timed(hand.heartbeat, leases)
                log.append((took, r.status_code))
                if r.status_code != 200:
                    seen.refused_beats.append(f"{ms(took)} {r.status_code} {r.text}")
            if len(seen.other_beats) >= 10 and all(f.done() for f in piled) and not other.is_alive():
                break
            time.sleep(0.05)
        held = time.monotonic() - started
        holder.execute("ROLLBACK")
        seen.completes = [f.result(timeout=60) for f in piled]
        other.join(60)
        pool.shutdown()

    beats = [s for s, _ in seen.other_beats]
    own = [s for s, _ in seen.stuck_beats]
    first = [r.status_code for _, r in seen.completes]
    waits = [s for s, _ in seen.completes]
    print(
        f"\n{name}: run held {held:.1f} s; {len(beats)} heartbeats of another run's worker meanwhile:"
        f" p50 {ms(statistics.median(beats))}, max {ms(max(beats))};"
        f" the stuck run's own worker: p50 {ms(statistics.median(own))}, max {ms(max(own))};"
        f" {PILE} piled completions first answered { ({c: first.count(c) for c in sorted(set(first))}) }"
        f" after {ms(min(waits))}..{ms(max(waits))};"
        f" the other run's completion {seen.other_complete[1].status_code if seen.other_complete else '-'}"
        f" after {ms(seen.other_complete[0]) if seen.other_complete else '-'};"
        f" readiness {[(x['http'], x.get('status')) for x in seen.readiness]}"
    )

    # Heartbeats never queued behind the pile.
    # The stuck run's own worker's too: the heartbeat outwaits its completion at the head of the run's queue
    # (awp._outwait_completion) instead of timing out with it.
    assert not seen.refused_beats, seen.refused_beats
    assert max(beats) < 1.0, f"a heartbeat took {ms(max(beats))} while another run was stuck"
    # The stuck run's own worker: its completions that lock its row (complete_and_claim, completions) queue for
    # the run before they take that row, so its heartbeats do not wait behind the advisory lock at all. While a
    # non-completion holds the run's row, a heartbeat waits for the completion at the head of the queue to give
    # up (a lock_timeout); PostgreSQL may then hand the freed worker row to the next completion first (it wakes
    # sooner on a busy machine: seen with two in turn), so a heartbeat may wait for a few of them, never for the
    # pile, and is never refused for it (above).
    assert max(own) < (1.0 if "advisory" in name else 3 * LOCK_TIMEOUT_S), own
    # The other run's completion landed while the stuck run was still held.
    assert seen.other_complete is not None and seen.other_complete[1].status_code == 200, seen.other_complete
    # Each piled completion answered 503 unavailable with Retry-After once lock_timeout passed (on a slow machine
    # the last ones may instead have waited the 5 s for a connection in vain: 503 too).
    for took, r in seen.completes:
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "unavailable", r.text
        assert int(r.headers["Retry-After"]) >= 1, r.headers
        assert took >= LOCK_TIMEOUT_S * 0.9, f"answered after {ms(took)}, before lock_timeout"
    lock_timeouts = [r for _, r in seen.completes if "(lock_timeout)" in r.json()["error"]["message"]]
    assert len(lock_timeouts) >= PILE // 2, [r.json()["error"]["message"] for _, r in seen.completes]
    # /health/ready told a saturated request pool (200) from a database that is down (503).
    saturated = [x for x in seen.readiness if x["status"] == "saturated"]
    assert saturated and all(x["http"] == 200 for x in saturated), seen.readiness
    assert saturated[0]["database"] == "ok" and saturated[0]["pools"]["requests"]["max"] == 10, saturated[0]

    # After the release, the refused completions are sent again (as a worker does) and every one applies.
    deadline = time.monotonic() + 30
    for lease, route in zip(stuck_leases, routes, strict=True):
        again = stuck_worker.complete_until_applied(lease, deadline, route)
        assert again.status_code == 200, again.text
    assert wait_run(gw, stuck_run)["status"] == "succeeded"
    assert wait_run(gw, other_run)["status"] == "succeeded"
    with psycopg.connect(db_dsn, autocommit=True) as c:
        assert c.execute("SELECT * FROM awp.check_invariants()").fetchall() == []
        done = one(c, "SELECT count(*) FROM awp.dispatches WHERE run_id = %s AND status = 'completed'", [stuck_run])[0]
        assert done == PILE
    ready = httpx.get(gw.url("/health/ready"), timeout=10).json()
    assert ready["pools"]["requests"]["waiting"] == 0, ready
    for w in (stuck_worker, other_worker):
        w.post("/drain", {})
    return seen


def test_a_run_row_locked_in_another_session(gw: ServeProcess, db_dsn: str) -> None:
    pile_up(gw, db_dsn, "row", "SELECT 1 FROM awp.runs WHERE run_id = %s FOR UPDATE")


def test_a_run_advisory_lock_held_in_another_session(gw: ServeProcess, db_dsn: str) -> None:
    pile_up(gw, db_dsn, "advisory", "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))")


# ---- the pieces, one by one ------------------------------------------------------------------------------------


def test_every_request_connection_has_the_timeouts(db_dsn: str) -> None:
    async def settings() -> list[tuple[str, str, str]]:
        db = Database(db_dsn, pool_size=2, heartbeat_pool_size=1, lock_timeout_ms=1234, statement_timeout_ms=5678)
        await db.open()
        try:
            query = (
                "SELECT current_setting('lock_timeout') AS l, current_setting('statement_timeout') AS s,"
                " current_setting('TimeZone') AS tz"
            )
            found = []
            for pool in (db.pool, db.heartbeat_pool):
                row = await db._row(query, (), pool)
                found.append((row["l"], row["s"], row["tz"]))
            return found
        finally:
            await db.close()

    assert asyncio.run(settings()) == [("1234ms", "5678ms", "UTC"), ("1234ms", "5678ms", "UTC")]


def test_serve_help_shows_the_timeouts_and_pools() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "awp", "serve", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    blocks = {b.split()[0]: " ".join(b.split()) for b in re.split(r"\n(?=\s+--)", out) if b.strip().startswith("--")}
    for option, default in (
        ("--lock-timeout-ms", "2000"),
        ("--statement-timeout-ms", "10000"),
        ("--heartbeat-pool-size", "2"),
        ("--pool-size", "10"),
    ):
        assert f"default: {default}" in blocks.get(option, ""), (option, out)


def _session(c: psycopg.Connection, kinds: str = "mock") -> tuple[str, str]:
    row = one(c, "SELECT worker_id, session_token FROM awp.register_worker('h', ARRAY[%s], 4)", [kinds])
    return row[0], row[1]


def _one_task_run(c: psycopg.Connection, workflow: str) -> str:
    definition = json.dumps({"id": workflow, "tasks": [{"key": "a", "executor": "mock"}]})
    c.execute("SELECT * FROM awp.create_workflow_version(%s)", [definition])
    return one(c, "SELECT awp.start_run(%s)", [workflow])[0]


def test_a_wrong_lease_token_is_refused_without_waiting_for_the_run(db_dsn: str) -> None:
    """The early reject: a completion whose lease token is wrong answers lease_lost at once, also while the
    run's advisory lock is held elsewhere (the check under the lock stays the authoritative one)."""
    with psycopg.connect(db_dsn, autocommit=True) as c, psycopg.connect(db_dsn, autocommit=True) as holder:
        run_id = _one_task_run(c, "early-reject")
        worker = _session(c)
        c.execute("SELECT awp.coordinator_tick()")
        lease = c.execute("SELECT dispatch_id FROM awp.claim_tasks(%s, %s, 1)", list(worker)).fetchone()
        assert lease is not None
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [run_id])
        c.execute("SET lock_timeout = '5s'")  # bounds a regression; the early reject never waits
        success = '{"kind": "success"}'
        for call in (
            "SELECT awp.complete_task(%s, %s, %s, 'wrong', %s)",
            "SELECT * FROM awp.complete_and_claim(%s, %s, %s, 'wrong', %s, 1)",
        ):
            t0 = time.monotonic()
            with pytest.raises(psycopg.Error) as refused:
                c.execute(call, [*worker, lease[0], success])
            assert refused.value.sqlstate == "AWLST", refused.value
            assert time.monotonic() - t0 < 2.0
        items = json.dumps([{"dispatch_id": lease[0], "lease_token": "wrong", "result": {"kind": "success"}}])
        t0 = time.monotonic()
        answer = one(c, "SELECT awp.complete_tasks(%s, %s, %s, 0)", [*worker, items])[0]
        assert answer["results"][0]["error"]["sqlstate"] == "AWLST" and time.monotonic() - t0 < 2.0, answer
        holder.execute("ROLLBACK")


def test_a_heartbeat_outwaits_its_worker_completion_queued_on_a_held_run(db_dsn: str) -> None:
    """While another session holds a run's row, a completion of that run that also claims holds its worker's
    row and waits (up to lock_timeout) for the run's. The worker's heartbeat waits for its worker's row with
    twice its own lock_timeout (awp._outwait_completion): with a lock_timeout shorter than the completion's it
    is still answered, after the completion gave up, instead of timing out first. Equal timeouts (the gateway)
    race without it: the CI once saw such a heartbeat answered 503."""
    with (
        psycopg.connect(db_dsn, autocommit=True) as c,
        psycopg.connect(db_dsn, autocommit=True) as holder,
        psycopg.connect(db_dsn, autocommit=True) as completer,
    ):
        run_id = _one_task_run(c, "heartbeat-outwaits")
        worker = _session(c)
        c.execute("SELECT awp.coordinator_tick()")
        lease = one(c, "SELECT dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 1)", list(worker))
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM awp.runs WHERE run_id = %s FOR UPDATE", [run_id])
        completer.execute("SET lock_timeout = '2s'")
        pid = completer.info.backend_pid
        success = '{"kind": "success"}'
        call = in_thread(
            lambda: timed(
                lambda: completer.execute(
                    "SELECT * FROM awp.complete_and_claim(%s, %s, %s, %s, %s, 1)", [*worker, *lease, success]
                ).fetchall()
            )
        )
        blockers = wait_blocked(c, pid, call)
        assert blockers == [holder.info.backend_pid], blockers
        c.execute("SET lock_timeout = '1500ms'")  # shorter than the completion's: alone it would give up first
        try:
            took, answer = timed(
                lambda: c.execute(
                    "SELECT status FROM awp.heartbeat(%s, %s, %s)",
                    [*worker, json.dumps([{"dispatch_id": lease[0], "lease_token": lease[1]}])],
                ).fetchall()
            )
            with pytest.raises(psycopg.errors.LockNotAvailable):
                call.result(10)
        finally:
            holder.execute("ROLLBACK")
            call.thread.join(10)
        print(f"\nheartbeat behind its worker's completion queued on a held run: answered after {ms(took)}")
        assert answer == [("renewed",)], answer
        assert 1.0 < took < 5.0, took  # it waited for the completion to give up, and no longer
        assert one(c, "SELECT current_setting('lock_timeout')")[0] == "1500ms"  # only that transaction's
        # The completion, sent again, applies (the run's only task: the run succeeds).
        c.execute("SELECT * FROM awp.complete_and_claim(%s, %s, %s, %s, %s, 1)", [*worker, *lease, success])
        assert one(c, "SELECT status FROM awp.runs WHERE run_id = %s", [run_id])[0] == "succeeded"


def test_a_claim_gives_up_a_stuck_run_and_frees_its_worker(db_dsn: str) -> None:
    """A claim whose only candidate's run is held waits a bounded time (500 ms) for it, then answers empty:
    meanwhile it holds its worker's row, so that worker's heartbeat waits no longer than that. The bound is
    the claim's own: the caller's lock_timeout is what it was afterwards, whether the wait ended or gave up."""
    with (
        psycopg.connect(db_dsn, autocommit=True) as c,
        psycopg.connect(db_dsn, autocommit=True) as holder,
        psycopg.connect(db_dsn, autocommit=True) as claimer,
    ):
        run_id = _one_task_run(c, "claim-bound")
        worker = _session(c, "mock")
        c.execute("SELECT awp.coordinator_tick()")
        claim = "SELECT * FROM awp.claim_tasks(%s, %s, 1)"
        pid = claimer.info.backend_pid
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM awp.runs WHERE run_id = %s FOR UPDATE", [run_id])
        call = in_thread(lambda: timed(lambda: claimer.execute(claim, list(worker)).fetchall()))
        wait_blocked(c, pid, call)
        c.execute("SET lock_timeout = '5s'")  # bounds a regression: the heartbeat waits for its worker's claim
        try:
            took, _ = timed(lambda: c.execute("SELECT * FROM awp.heartbeat(%s, %s, '[]')", list(worker)).fetchall())
            claimed, leases = call.result(10)
        finally:  # a claim that did not give up is freed, so that a failure ends the test instead of hanging it
            holder.execute("ROLLBACK")
            call.thread.join(10)
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM awp.runs WHERE run_id = %s FOR UPDATE", [run_id])
        print(f"\nclaim on a stuck run: gave up after {ms(claimed)}; its worker's heartbeat waited {ms(took)}")
        assert leases == [] and claimed < 3.0, (claimed, leases)
        assert took < 3.0, f"the worker's heartbeat waited {ms(took)} behind its claim"
        # In a transaction with its own lock_timeout: after giving up, that setting is back.
        claimer.execute("BEGIN")
        claimer.execute("SET LOCAL lock_timeout = '7s'")
        assert claimer.execute(claim, list(worker)).fetchall() == []
        assert one(claimer, "SELECT current_setting('lock_timeout')")[0] == "7s"
        claimer.execute("COMMIT")
        # A short hold is waited for (a busy run, not a stuck one) and the lease is taken from it.
        holder.execute("ROLLBACK")
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM awp.runs WHERE run_id = %s FOR UPDATE", [run_id])
        claimer.execute("BEGIN")
        claimer.execute("SET LOCAL lock_timeout = '7s'")
        call = in_thread(lambda: claimer.execute("SELECT * FROM awp.claim_tasks(%s, %s, 1)", list(worker)).fetchall())
        wait_blocked(c, pid, call)
        holder.execute("ROLLBACK")
        assert [x[4] for x in call.result(10)] == [run_id]
        assert one(claimer, "SELECT current_setting('lock_timeout')")[0] == "7s"
        claimer.execute("COMMIT")


def test_a_worker_retries_a_completion_answered_503(db_dsn: str) -> None:
    """A real ``awp worker``: its completion waits for a held run, the gateway (lock_timeout 300 ms) answers 503
    with Retry-After, the worker retries (waiting at least about the Retry-After), and after the release the
    task succeeds once."""
    with (
        serve(db_dsn, coordinator_interval_ms=100, args=["--lock-timeout-ms", "300"]) as gw,
        Workers(gw) as workers,
        psycopg.connect(db_dsn, autocommit=True) as c,
        psycopg.connect(db_dsn, autocommit=True) as holder,
    ):
        worker = workers.start("retry-503", concurrency=1)
        run_id = start_run(gw, apply(gw, {"id": "retry-503", "tasks": [mock_task("a", sleep_ms=1500)]}))
        wait_until(
            lambda: c.execute(
                "SELECT 1 FROM awp.attempts WHERE run_id = %s AND status = 'running'", [run_id]
            ).fetchone(),
            20,
            0.02,
            "the attempt running",
        )
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM awp.runs WHERE run_id = %s FOR UPDATE", [run_id])
        line = worker.wait_log("complete failed (503 unavailable", 20)
        retry = re.findall(r"complete failed \(503 unavailable[^\n]*retrying in ([0-9.]+)s", worker.log())
        assert retry and float(retry[0]) >= 0.5, line  # Retry-After: 1 -> at least half of it, jittered
        holder.execute("ROLLBACK")
        assert wait_run(gw, run_id)["status"] == "succeeded"
        worker.wait_log("completed", 10)
        attempts = one(c, "SELECT count(*) FROM awp.attempts WHERE run_id = %s", [run_id])[0]
        assert attempts == 1
        assert c.execute("SELECT * FROM awp.check_invariants()").fetchall() == []
