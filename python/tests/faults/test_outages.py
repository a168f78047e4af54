"""Lease recovery under faults (issue 13; docs/protocol.md, Lease recovery), with real processes, a real PostgreSQL
of their own and ``max_attempts`` 1 everywhere, so a single wasted attempt fails a run:

- PostgreSQL stopped for twice the lease while tasks run: every run succeeds;
- every gateway killed (SIGKILL) for twice the lease while tasks run: every run succeeds;
- a lost claim answer (a proxy between worker and gateway drops the response of a claim, or of a complete that
  claimed, after the gateway committed it): the lease goes back to the queue within two heartbeat intervals,
  the task then runs and succeeds, and its history shows the released attempt as not_received, not counted.

Each scenario ends with ``awp.check_invariants()`` empty and records its figures (``fault_support.record``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

import httpx
import pytest
from fault_support import (
    assert_clean,
    attempts,
    configure,
    ms,
    query,
    record,
    wait_runs_db,
)
from worker_support import RecordingProxy, Workers, api, apply, mock_task, start_run

from awp.dev.localdb import Cluster
from awp_testing.gateway import ServeProcess, Tokens, serve, start_serve, wait_until

LEASE_MS = 2000
HEARTBEAT_MS = 250
# Workers go offline after this many silent heartbeat intervals (10 s). With 250 ms heartbeats the default 3 (750 ms)
# is shorter than a gateway takes to reconnect its pools after PostgreSQL comes back (a few seconds): the workers
# would be marked offline while their heartbeats still cannot get through. (With the default settings, 5 s
# heartbeats and 15 s leases, the window is 15 s.)
OFFLINE_AFTER = 40
SLOTS = 3  # per worker; two workers


def outage_runs(gw: ServeProcess, n: int = 2) -> list[str]:
    """``n`` runs of six tasks each, max_attempts 1: per run three long ones (3 s: cut by their workers' local safety
    deadline during the outage) and three short ones (1.2 s: they finish during the outage and their workers hold
    the results), alternating, so the first leases (one task per run per round) are a mix of both."""
    tasks = [mock_task(f"{kind}{i}", sleep_ms=ms_) for i in range(3) for kind, ms_ in (("long", 3000), ("short", 1200))]
    wf = apply(gw, {"id": "outage", "concurrency": 6, "tasks": tasks})
    return [start_run(gw, wf) for _ in range(n)]


def leased(dsn: str) -> list[dict[str, Any]]:
    return query(dsn, "SELECT dispatch_id FROM awp.dispatches WHERE status = 'leased'")


def received(workers: list[Any], held: list[dict[str, Any]]) -> bool:
    """Every lease in ``held`` is in some worker's log (its claim answer arrived: its execution is under way)."""
    logs = "".join(w.log() for w in workers)
    return all(x["dispatch_id"] in logs for x in held)


def db_now(dsn: str) -> Any:
    return query(dsn, "SELECT now() AS t")[0]["t"]


def outcome(dsn: str, run_ids: list[str], cut_at: Any, back_at: Any) -> dict[str, Any]:
    """The attempts spent by ``run_ids``: by status, how many did not count, the results held through the outage
    (attempts started before ``cut_at`` that succeeded after it), and how long after ``back_at`` (database time,
    the end of the outage) the last attempt lost to it was ended and its task queued again."""
    rows = query(
        dsn,
        "SELECT status, counted, started_at < %s AND finished_at > %s AS across FROM awp.attempts "
        "WHERE run_id = ANY(%s)",
        (cut_at, cut_at, run_ids),
    )
    by_status: dict[str, int] = {}
    for r in rows:
        key = r["status"] + ("" if r["counted"] else " (not counted)")
        by_status[key] = by_status.get(key, 0) + 1
    tasks = query(dsn, "SELECT count(*) AS n FROM awp.tasks WHERE run_id = ANY(%s)", (run_ids,))[0]["n"]
    requeued = query(
        dsn,
        "SELECT max(finished_at) - %s AS d FROM awp.attempts WHERE run_id = ANY(%s) AND NOT counted",
        (back_at, run_ids),
    )[0]["d"]
    return {
        "tasks": tasks,
        "attempts": len(rows),
        "attempts_by_status": by_status,
        "attempts_not_counted": sum(1 for r in rows if not r["counted"]),
        "held_results_accepted": sum(1 for r in rows if r["status"] == "succeeded" and r["across"]),
        "back_to_lost_attempts_requeued_ms": ms(requeued.total_seconds()) if requeued is not None else None,
    }


def lost_attempts(dsn: str, run_ids: list[str]) -> list[dict[str, Any]]:
    """The attempts of ``run_ids`` that did not succeed, with their times and why they ended: what a failure of
    this file shows (a flaky run on a busy machine must say which rule counted an attempt)."""
    return query(
        dsn,
        "SELECT run_id, task_key, attempt, status, counted, worker_id, started_at, finished_at, error_code,"
        " error_message FROM awp.attempts WHERE run_id = ANY(%s) AND status <> 'succeeded'"
        " ORDER BY started_at",
        (run_ids,),
    )


def check_outcome(dsn: str, run_ids: list[str], figures: dict[str, Any]) -> None:
    statuses = query(dsn, "SELECT status FROM awp.runs WHERE run_id = ANY(%s)", (run_ids,))
    assert [r["status"] for r in statuses] == ["succeeded"] * len(run_ids), (statuses, lost_attempts(dsn, run_ids))
    # The long tasks were cut short by their workers' local safety deadline during the outage: their attempts end
    # without counting (max_attempts is 1, so a counted one would have failed the run).
    assert figures["attempts_not_counted"] >= 1, figures
    assert "failed" not in figures["attempts_by_status"], figures
    counted = query(
        dsn, "SELECT max(attempts - uncounted_attempts) AS n FROM awp.tasks WHERE run_id = ANY(%s)", (run_ids,)
    )
    assert counted[0]["n"] == 1, "every task succeeded with its single counted attempt"
    assert_clean(dsn)


# ---- PostgreSQL down for twice the lease ---------------------------------------------------------------------


def test_database_down_twice_the_lease_fails_no_run(cluster: Cluster, dsn: str) -> None:
    configure(dsn, LEASE_MS, HEARTBEAT_MS, offline_after_heartbeats=OFFLINE_AFTER)
    down_for = 2 * LEASE_MS / 1000
    with serve(dsn, coordinator_interval_ms=100) as gw, Workers(gw) as workers:
        procs = [workers.start(f"db-{i}", concurrency=SLOTS) for i in range(2)]
        run_ids = outage_runs(gw)
        wait_until(lambda: len(leased(dsn)) == 2 * SLOTS, 20, 0.02, "every slot leased")
        held = leased(dsn)
        wait_until(lambda: received(procs, held), 10, 0.02, "the leases in the workers' hands")
        cut_at = db_now(dsn)
        cluster.stop(mode="immediate")
        stopped = time.monotonic()
        time.sleep(max(0.0, down_for - (time.monotonic() - stopped)))
        cluster.start(fsync=False)
        started = time.monotonic()
        back_at = db_now(dsn)
        wait_runs_db(dsn, run_ids, timeout=120)
        recovered = time.monotonic() - started
        for w in procs:
            assert w.alive(), f"{w.name} exited:\n{w.log()[-2000:]}"
        kept = sum(w.log().count("complete failed") for w in procs)
    figures = outcome(dsn, run_ids, cut_at, back_at)
    check_outcome(dsn, run_ids, figures)
    record(
        "13a_postgres_down_2x_lease",
        lease_ms=LEASE_MS,
        heartbeat_ms=HEARTBEAT_MS,
        database_down_ms=ms(down_for),
        max_attempts=1,
        runs=len(run_ids),
        runs_succeeded=len(run_ids),
        start_to_every_run_succeeded_ms=ms(recovered),
        complete_retries_during_outage=kept,
        violations=0,
        **figures,
    )


# ---- every gateway down for twice the lease ------------------------------------------------------------------


def test_every_gateway_killed_twice_the_lease_fails_no_run(dsn: str) -> None:
    configure(dsn, LEASE_MS, HEARTBEAT_MS, offline_after_heartbeats=OFFLINE_AFTER)
    down_for = 2 * LEASE_MS / 1000
    tokens = Tokens()
    gateways = [start_serve(dsn, tokens=tokens, coordinator_interval_ms=100) for _ in range(2)]
    pools = [Workers(gw) for gw in gateways]
    try:
        procs = [pools[i].start(f"gw-{i}", concurrency=SLOTS) for i in range(2)]
        run_ids = outage_runs(gateways[0])
        wait_until(lambda: len(leased(dsn)) == 2 * SLOTS, 20, 0.02, "every slot leased")
        held = leased(dsn)
        wait_until(lambda: received(procs, held), 10, 0.02, "the leases in the workers' hands")
        cut_at = db_now(dsn)
        for gw in gateways:
            gw.kill()
        killed = time.monotonic()
        time.sleep(max(0.0, down_for - (time.monotonic() - killed)))
        gateways = [
            start_serve(dsn, tokens=tokens, coordinator_interval_ms=100, port=gw.port, wait_ready=False)
            for gw in gateways
        ]
        restarted = time.monotonic()
        back_at = db_now(dsn)
        wait_runs_db(dsn, run_ids, timeout=120)
        recovered = time.monotonic() - restarted
        for w in procs:
            assert w.alive(), f"{w.name} exited:\n{w.log()[-2000:]}"
        resumed = query(dsn, "SELECT count(*) AS n FROM awp.dispatches WHERE uncounted = 'outage'")[0]["n"]
    finally:
        for pool in pools:
            pool.__exit__(None, None, None)
        for gw in gateways:
            gw.kill()
            with contextlib.suppress(OSError):
                gw.log_path.unlink()
    figures = outcome(dsn, run_ids, cut_at, back_at)
    check_outcome(dsn, run_ids, figures)
    assert resumed >= 1, "the first pass after the outage resumed the live leases"
    record(
        "13b_every_gateway_killed_2x_lease",
        lease_ms=LEASE_MS,
        heartbeat_ms=HEARTBEAT_MS,
        gateways=len(gateways),
        gateways_down_ms=ms(down_for),
        max_attempts=1,
        runs=len(run_ids),
        runs_succeeded=len(run_ids),
        restart_to_every_run_succeeded_ms=ms(recovered),
        leases_resumed_after_outage=resumed,
        violations=0,
        **figures,
    )


# ---- a lost claim answer ---------------------------------------------------------------------------------------


class LossyProxy(RecordingProxy):
    """A :class:`RecordingProxy` that, once armed, drops the answer of the first request to a path ending with
    ``suffix`` whose answer carries a lease: the gateway has committed it, the worker sees its connection closed
    without an answer (as when a gateway dies right after its commit). ``dropped`` is that lease; ``dropped_at``
    the time.monotonic() of the drop."""

    def __init__(self, upstream: str, suffix: str) -> None:
        self.suffix = suffix
        self.armed = True
        self.dropped: dict[str, Any] | None = None
        self.dropped_at = 0.0
        self._drop_lock = threading.Lock()
        super().__init__(upstream)

    def drop_answer(self, path: str, status: int, data: bytes) -> bool:
        if status != 200 or not path.split("?")[0].endswith(self.suffix):
            return False
        with self._drop_lock:
            if not self.armed:
                return False
            try:
                leases = json.loads(data).get("leases") or []
            except ValueError:
                return False
            if not leases:
                return False
            self.armed = False
            self.dropped, self.dropped_at = leases[0], time.monotonic()
            return True


@pytest.mark.parametrize("route", ["claims", "complete"])
def test_lost_claim_answer_goes_back_to_the_queue_within_two_heartbeats(dsn: str, route: str) -> None:
    """The answer of a claim (``claims``), or of a complete that claimed the next lease (``complete``), is lost after
    the gateway committed it. The lease (its answer never arrived) is released at the worker's next heartbeat,
    long before it would expire, and its task then runs and succeeds with max_attempts 1."""
    lease_ms, heartbeat_ms = 10_000, 1_000
    configure(dsn, lease_ms, heartbeat_ms)
    with serve(dsn, coordinator_interval_ms=100) as gw:
        proxy = LossyProxy(gw.base_url, "/claims" if route == "claims" else "/complete")
        try:
            with Workers(None, gateway_url=proxy.url, bootstrap=gw.tokens.bootstrap) as workers:
                w = workers.start(f"lossy-{route}", concurrency=1)
                keys = ["first", "second"] if route == "complete" else ["only"]
                tasks = [mock_task(k, sleep_ms=200) for k in keys]  # max_attempts 1
                run_id = start_run(gw, apply(gw, {"id": f"lost-{route}", "concurrency": 1, "tasks": tasks}))
                wait_until(lambda: proxy.dropped is not None, 30, 0.01, "a claim answer to drop")
                lost = proxy.dropped
                assert lost is not None
                key = lost["task_key"]

                def released() -> bool:
                    sql = "SELECT status FROM awp.dispatches WHERE dispatch_id = %s"
                    return query(dsn, sql, (lost["dispatch_id"],))[0]["status"] == "expired"

                wait_until(released, lease_ms / 1000, 0.01, "the lost lease to go back to the queue")
                release_s = time.monotonic() - proxy.dropped_at
                wait_runs_db(dsn, [run_id], timeout=30)
                assert w.alive()
        finally:
            proxy.close()
        # Generous for a busy machine, but far below the lease (10 s) it would otherwise have waited for.
        assert release_s < 2 * heartbeat_ms / 1000 + 1.5, f"released after {release_s:.2f}s"
        history = api(gw, "GET", f"/runs/{run_id}/tasks/{key}")
    assert query(dsn, "SELECT status FROM awp.runs WHERE run_id = %s", (run_id,))[0]["status"] == "succeeded"
    spent = attempts(dsn, run_id, key)
    assert [(a["status"], a["counted"]) for a in spent] == [("not_received", False), ("succeeded", True)]
    assert spent[0]["dispatch_id"] == lost["dispatch_id"]
    assert history["max_attempts"] == 1 and history["status"] == "succeeded"
    assert [(a["status"], a["counted"]) for a in history["attempt_history"]] == [
        ("not_received", False),
        ("succeeded", True),
    ]
    events = query(
        dsn,
        "SELECT from_status, to_status, reason FROM awp.run_events(%s) WHERE entity_key = %s",
        (run_id, f"{key}#1"),
    )
    assert [(e["from_status"], e["to_status"], e["reason"]) for e in events] == [
        (None, "running", events[0]["reason"]),
        ("running", "not_received", "not received by its worker"),
    ]
    assert_clean(dsn)
    record(
        f"13c_lost_{route}_answer",
        lease_ms=lease_ms,
        heartbeat_ms=heartbeat_ms,
        max_attempts=1,
        drop_to_lease_released_ms=ms(release_s),
        attempts=[f"#{a['attempt']} {a['status']}{'' if a['counted'] else ' (not counted)'}" for a in spent],
        run_status="succeeded",
        violations=0,
    )


# ---- the new fields are validated -----------------------------------------------------------------------------


def test_lease_recovery_fields_are_checked(dsn: str) -> None:
    """claim_seq, claimed_through, claims_pending and dropped: a malformed value is a 400 invalid_request (never a
    5xx), a well-formed one is accepted, and none of them is required (an older worker sends none)."""
    # The requests below send no heartbeat the database accepts: the session must outlive them on a slow machine
    # (the default 3 intervals, 750 ms, did not once: the last, well-formed heartbeat was answered AWSES).
    configure(dsn, LEASE_MS, HEARTBEAT_MS, offline_after_heartbeats=OFFLINE_AFTER)
    with serve(dsn, coordinator_interval_ms=100) as gw:
        r = httpx.post(
            gw.api("/workers/register"), json={"executor_kinds": ["mock"]}, headers=gw.auth("bootstrap"), timeout=10
        )
        assert r.status_code == 201, r.text
        worker_id = r.json()["worker_id"]
        headers = {"Authorization": f"Bearer {r.json()['session_token']}", "X-Worker-Protocol-Version": "1"}

        def post(path: str, body: dict[str, Any]) -> httpx.Response:
            return httpx.post(gw.api(f"/workers/{worker_id}{path}"), json=body, headers=headers, timeout=10)

        ref = {"dispatch_id": "dsp_x", "lease_token": "t"}
        result = {"lease_token": "t", "result": {"kind": "success"}, "claim_slots": 1}
        bad: list[tuple[str, dict[str, Any]]] = [
            ("/claims", {"slots": 1, "claim_seq": 0}),
            ("/claims", {"slots": 1, "claim_seq": "1"}),
            ("/claims", {"slots": 1, "claim_seq": 2**63}),
            ("/leases/dsp_x/complete", {**result, "claim_seq": -1}),
            ("/completions", {"results": [{**ref, "result": {"kind": "success"}}], "claim_seq": True}),
            ("/heartbeat", {"leases": [], "claimed_through": -1}),
            ("/heartbeat", {"leases": [], "claimed_through": 1.5}),
            ("/heartbeat", {"leases": [], "claimed_through": 3, "claims_pending": [0]}),
            ("/heartbeat", {"leases": [], "claimed_through": 3, "claims_pending": "3"}),
            ("/heartbeat", {"leases": [], "claims_pending": [3]}),
            ("/heartbeat", {"leases": [], "claimed_through": 3, "claims_pending": list(range(1, 1026))}),
            ("/heartbeat", {"leases": [], "dropped": [{"dispatch_id": "dsp_x"}]}),
            ("/heartbeat", {"leases": [], "dropped": {}}),
        ]
        for path, body in bad:
            r = post(path, body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", (path, body, r.text)
        r = post("/heartbeat", {"leases": [], "claimed_through": 3, "claims_pending": [3], "dropped": [ref]})
        assert r.status_code == 200 and r.json() == {"leases": [], "worker_status": "active"}, r.text
        r = post("/claims", {"slots": 1, "claim_seq": 4})
        assert r.status_code == 200 and r.json() == {"leases": []}, r.text
