"""Grouped completions (docs/protocol.md, Refill and claim on complete; python/awp/server/grouping.py).

Through a real ``awp serve``: while one claim-on-complete call is in flight (here: waiting for a run's lock, held
by a test transaction as a busy completion would), the gateway holds the other calls, of that run and of others,
and sends them together as one ``awp.complete_and_claim_many`` call. Each worker gets the answer its own call
would have given (applied with the next lease; a wrong lease token 409 ``lease_lost``, with the message of a
call made alone), the grouped completions share one transaction (one run revision, one commit time), and nothing
is lost. A grouped call that cannot take its locks in time (a stuck run) hands its items to their runs' own
queues, and the other runs' calls go on without them. With several lanes (``--group-lanes``), real workers on
several runs finish every run without a server error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

import httpx
import psycopg
import pytest
from sync_support import gateway_lock_waiters
from worker_support import Workers, apply, get_run, mock_task, start_run

from awp.server.grouping import RunGroups
from awp_testing.cluster import one
from awp_testing.gateway import PROTOCOL, ServeProcess, bearer, serve, wait_until

WORKERS = 6


GATEWAY_OPTIONS = {"coordinator_interval_ms": 200}


def register(gw: ServeProcess) -> tuple[str, dict[str, str]]:
    r = httpx.post(
        gw.api("/workers/register"),
        json={"executor_kinds": ["mock"], "max_concurrency": 1},
        headers=gw.auth("bootstrap"),
        timeout=10,
    )
    assert r.status_code == 201, r.text
    return r.json()["worker_id"], {**bearer(r.json()["session_token"]), **PROTOCOL}


def claim_one(gw: ServeProcess, worker: tuple[str, dict[str, str]]) -> dict[str, Any]:
    worker_id, headers = worker
    r = httpx.post(
        gw.api(f"/workers/{worker_id}/claims"), json={"slots": 1, "wait_ms": 5000}, headers=headers, timeout=10
    )
    assert r.status_code == 200 and len(r.json()["leases"]) == 1, r.text
    return dict(r.json()["leases"][0])


def complete(gw: ServeProcess, worker: tuple[str, dict[str, str]], lease: dict[str, Any], token: str) -> httpx.Response:
    worker_id, headers = worker
    body = {"lease_token": token, "result": {"kind": "success", "output": {"k": lease["task_key"]}}, "claim_slots": 1}
    return httpx.post(
        gw.api(f"/workers/{worker_id}/leases/{lease['dispatch_id']}/complete"), json=body, headers=headers, timeout=30
    )


def test_one_runs_completions_in_flight_together_are_grouped_and_answered_each_as_alone(
    gw: ServeProcess, db_dsn: str
) -> None:
    run_id = start_run(
        gw, apply(gw, {"id": "grouping", "concurrency": WORKERS, "tasks": [mock_task(f"t{i:02d}") for i in range(12)]})
    )
    workers = [register(gw) for _ in range(WORKERS)]
    leases = [claim_one(gw, w) for w in workers]
    tokens = [x["lease_token"] for x in leases]
    tokens[-1] = "not-the-lease-token"  # the last worker's result must be refused, alone
    with psycopg.connect(db_dsn, autocommit=True) as holder, psycopg.connect(db_dsn, autocommit=True) as probe:
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [run_id])  # the run is busy
        pool = concurrent.futures.ThreadPoolExecutor(WORKERS)
        sent = [pool.submit(complete, gw, w, x, t) for w, x, t in zip(workers, leases, tokens, strict=True)]
        wait_until(
            lambda: gateway_lock_waiters(probe) >= 1,
            15,
            0.02,
            "a completion waiting for the busy run",
        )
        time.sleep(0.5)  # every request has reached the gateway (loopback); the first waits in PostgreSQL
        # The grouped calls gave up on the busy run after the group lock wait (100 ms) and handed their items to
        # the run's own queue: one call of it waits in PostgreSQL, the others are held in the gateway.
        wait_until(lambda: gateway_lock_waiters(probe) == 1, 15, 0.02, "one call waiting for the busy run")
        time.sleep(0.3)
        waiting = gateway_lock_waiters(probe)
        holder.execute("COMMIT")
        answers = [f.result(timeout=30) for f in sent]
        pool.shutdown()

    assert waiting == 1, f"{waiting} gateway connections waited for the run: its calls were not held in the gateway"
    good, bad = answers[:-1], answers[-1]
    for r in good:
        assert r.status_code == 200, r.text
        assert r.json()["applied"] is True and len(r.json()["leases"]) == 1, r.text
    new_tasks = [r.json()["leases"][0]["task_key"] for r in good]
    assert len(set(new_tasks)) == len(good), f"each worker got a task of its own: {new_tasks}"
    assert bad.status_code == 409 and bad.json()["error"]["code"] == "lease_lost", bad.text
    alone = complete(gw, workers[-1], leases[-1], tokens[-1])  # the same request again, now alone
    assert alone.status_code == 409 and alone.json()["error"]["message"] == bad.json()["error"]["message"], alone.text

    metrics = httpx.get(gw.url("/metrics"), headers=gw.auth("operator"), timeout=10).text
    grouped = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith(("awp_grouped_completion_calls_total ", "awp_grouped_completions_total "))
    }
    assert grouped.get("awp_grouped_completion_calls_total", 0) >= 1, grouped
    assert grouped.get("awp_grouped_completions_total", 0) >= 2, grouped

    with psycopg.connect(db_dsn, autocommit=True) as c:
        per_revision = [
            n
            for (n,) in c.execute(
                "SELECT count(*) FROM awp.events WHERE run_id = %s AND entity_type = 'dispatch'"
                " AND to_status = 'completed' GROUP BY revision",
                [run_id],
            ).fetchall()
        ]
        assert sum(per_revision) == len(good)
        assert max(per_revision) >= 2, f"completions per transaction: {per_revision} (none were grouped)"
        assert one(c, "SELECT count(*) FROM awp.check_invariants()")[0] == 0
        assert (
            one(c, "SELECT status FROM awp.dispatches WHERE dispatch_id = %s", [leases[-1]["dispatch_id"]])[0]
            == "leased"
        ), "the refused item changed nothing"


@pytest.mark.parametrize("runs", ["one run", "five runs"])
def test_the_held_calls_go_to_the_database_before_the_call_before_them_is_answered(runs: str) -> None:
    """All calls queue behind the grouped call in flight, so the gateway hands on at once: when a call returns,
    the group held meanwhile is sent (its database call started) before the returning call's caller gets its
    answer, and the group's answers likewise before the next group's callers; calls of several runs go in one
    group. The database calls are stand-in coroutines here: what is tested is the order of the gateway's own
    steps (awp.server.grouping)."""
    order: list[tuple[str, str]] = []
    waits: set[int | None] = set()
    run_of = {d: ("r" if runs == "one run" else "r-" + d) for d in ("d1", "d2", "d3", "d4", "d5")}

    async def main() -> None:
        release = asyncio.Event()

        async def single(args: dict[str, Any], lock_wait_ms: int | None = None) -> list[dict[str, Any]]:
            order.append(("sent", args["dispatch_id"]))
            waits.add(lock_wait_ms)
            if args["dispatch_id"] == "d1":
                await release.wait()
            return [{"dispatch_id": "next-" + args["dispatch_id"], "run_id": run_of[args["dispatch_id"]]}]

        async def many(items: list[dict[str, Any]], lock_wait_ms: int | None = None) -> list[dict[str, Any]]:
            order.append(("sent", "+".join(i["dispatch_id"] for i in items)))
            waits.add(lock_wait_ms)
            if items[0]["dispatch_id"] == "d2":
                await release.wait()
            return [
                {
                    "group_item": n,
                    "group_error": None,
                    "dispatch_id": "next-" + i["dispatch_id"],
                    "run_id": run_of[i["dispatch_id"]],
                }
                for n, i in enumerate(items, start=1)
            ]

        groups = RunGroups(single, many, lock_wait_ms=100)
        groups.remember([{"dispatch_id": d, "run_id": run_of[d]} for d in run_of])

        async def call(dispatch_id: str) -> None:
            rows = await groups.complete_and_claim({"dispatch_id": dispatch_id})
            assert rows[0]["dispatch_id"] == "next-" + dispatch_id
            order.append(("answered", dispatch_id))

        first = asyncio.create_task(call("d1"))
        await asyncio.sleep(0)
        held = [asyncio.create_task(call(d)) for d in ("d2", "d3")]
        await asyncio.sleep(0)
        release.set()  # d1 returns while d2 and d3 are held; d2+d3 return while d4 and d5 are held
        later = [asyncio.create_task(call(d)) for d in ("d4", "d5")]
        await asyncio.gather(first, *held, *later)

    asyncio.run(main())
    assert order.index(("sent", "d2+d3")) < order.index(("answered", "d1")), order
    assert order.index(("sent", "d4+d5")) < min(order.index(("answered", "d2")), order.index(("answered", "d3"))), order
    assert {d for kind, d in order if kind == "answered"} == {"d1", "d2", "d3", "d4", "d5"}, order
    assert waits == {100}, "every grouped call waits at most the group lock wait for a lock"


class LockTimeout(Exception):
    """What psycopg raises when a statement's lock_timeout passed (its SQLSTATE is what the gateway reads)."""

    sqlstate = "55P03"


def test_a_group_that_cannot_take_its_locks_in_time_goes_run_by_run_and_the_others_go_on() -> None:
    """A grouped call that meets a stuck run (lock_timeout after the group lock wait: nothing was written) hands
    its items to their runs' own queues, which wait as long as a request may (no group lock wait); while the stuck
    run's queue has a call in flight, its next calls join that queue, and the other runs' calls keep going as
    grouped calls. Once the queue's call got through (the run is not stuck any more), what queued meanwhile goes
    back to the grouped calls. Stand-in database calls, as above."""
    calls: list[tuple[str, int | None]] = []
    answered: list[str] = []
    run_of = {"s1": "stuck", "s2": "stuck", "o1": "other", "o2": "other"}

    async def main() -> None:
        release = asyncio.Event()

        async def single(args: dict[str, Any], lock_wait_ms: int | None = None) -> list[dict[str, Any]]:
            dispatch_id = args["dispatch_id"]
            calls.append((dispatch_id, lock_wait_ms))
            if run_of[dispatch_id] == "stuck" and not release.is_set():
                if lock_wait_ms is not None:
                    raise LockTimeout("canceling statement due to lock timeout")
                await release.wait()
            return [{"dispatch_id": "next-" + dispatch_id, "run_id": run_of[dispatch_id]}]

        async def many(items: list[dict[str, Any]], lock_wait_ms: int | None = None) -> list[dict[str, Any]]:
            raise AssertionError(f"no group was expected here: {items}")

        groups = RunGroups(single, many, lock_wait_ms=100)
        groups.remember([{"dispatch_id": d, "run_id": r} for d, r in run_of.items()])

        async def call(dispatch_id: str) -> None:
            rows = await groups.complete_and_claim({"dispatch_id": dispatch_id})
            assert rows[0]["dispatch_id"] == "next-" + dispatch_id
            answered.append(dispatch_id)

        stuck = asyncio.create_task(call("s1"))
        for _ in range(3):
            await asyncio.sleep(0)  # s1's grouped call fails; s1 goes to its run's queue and waits there
        assert calls == [("s1", 100), ("s1", None)], calls
        stuck_next = asyncio.create_task(call("s2"))  # the stuck run's queue is busy: s2 joins it
        await asyncio.wait_for(call("o1"), 5)  # another run's call goes on as a grouped call, at once
        await asyncio.wait_for(call("o2"), 5)
        assert answered == ["o1", "o2"], answered
        release.set()
        await asyncio.wait_for(asyncio.gather(stuck, stuck_next), 5)

    asyncio.run(main())
    assert calls == [("s1", 100), ("s1", None), ("o1", 100), ("o2", 100), ("s2", 100)], calls
    assert answered[:2] == ["o1", "o2"] and sorted(answered[2:]) == ["s1", "s2"], answered


def test_lanes_keep_one_grouped_call_in_flight_each_and_a_run_always_takes_its_own() -> None:
    """--group-lanes 2: runs "a" and "d" fall in different lanes (CRC-32 of the run id), so a call of each is in
    flight at once; "b" shares "a"'s lane, so its call waits for that lane's call and goes in its next group.
    Stand-in database calls, as above."""
    started: list[list[str]] = []
    run_of = {"a1": "a", "d1": "d", "a2": "a", "b1": "b"}

    async def main() -> None:
        release = asyncio.Event()

        async def single(args: dict[str, Any], lock_wait_ms: int | None = None) -> list[dict[str, Any]]:
            started.append([args["dispatch_id"]])
            await release.wait()
            return [{"dispatch_id": "next-" + args["dispatch_id"], "run_id": run_of[args["dispatch_id"]]}]

        async def many(items: list[dict[str, Any]], lock_wait_ms: int | None = None) -> list[dict[str, Any]]:
            started.append([i["dispatch_id"] for i in items])
            return [
                {"group_item": n, "group_error": None, "dispatch_id": "next-" + i["dispatch_id"], "run_id": "x"}
                for n, i in enumerate(items, start=1)
            ]

        groups = RunGroups(single, many, lock_wait_ms=100, lanes=2)
        groups.remember([{"dispatch_id": d, "run_id": r} for d, r in run_of.items()])
        tasks = [asyncio.create_task(groups.complete_and_claim({"dispatch_id": d})) for d in ("a1", "d1", "a2", "b1")]
        for _ in range(3):
            await asyncio.sleep(0)
        assert started == [["a1"], ["d1"]], started  # one call per lane in flight; a2 and b1 held in a's lane
        release.set()
        answers = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert [rows[0]["dispatch_id"] for rows in answers] == ["next-a1", "next-d1", "next-a2", "next-b1"]

    asyncio.run(main())
    assert started == [["a1"], ["d1"], ["a2", "b1"]], started


def test_completions_of_several_runs_in_flight_together_share_one_transaction(db_dsn: str) -> None:
    """Three runs, two workers' leases in each. One completion waits for its run's lock (held by a test
    transaction; the group lock wait is long here, so the grouped call waits instead of handing on); the other
    five, of all three runs, are held meanwhile and go as one awp.complete_and_claim_many call: one commit time
    for all five, each answered with its next lease, and the runs' histories stay whole."""
    with serve(
        db_dsn, coordinator_interval_ms=200, args=["--group-lock-wait-ms", "60000", "--lock-timeout-ms", "60000"]
    ) as gw2:
        wf = apply(gw2, {"id": "grouping-runs", "concurrency": 2, "tasks": [mock_task(f"t{i}") for i in range(4)]})
        runs = [start_run(gw2, wf) for _ in range(3)]
        workers = [register(gw2) for _ in range(6)]
        leases = [claim_one(gw2, w) for w in workers]
        by_run = {r: [n for n, x in enumerate(leases) if x["run_id"] == r] for r in runs}
        assert sorted(len(v) for v in by_run.values()) == [2, 2, 2], by_run
        first = by_run[runs[0]][0]
        others = [n for n in range(6) if n != first]
        with psycopg.connect(db_dsn, autocommit=True) as holder, psycopg.connect(db_dsn, autocommit=True) as probe:
            holder.execute("BEGIN")
            holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [runs[0]])
            pool = concurrent.futures.ThreadPoolExecutor(6)
            head = pool.submit(complete, gw2, workers[first], leases[first], leases[first]["lease_token"])
            wait_until(lambda: gateway_lock_waiters(probe) >= 1, 15, 0.02, "the first completion waiting")
            sent = [pool.submit(complete, gw2, workers[n], leases[n], leases[n]["lease_token"]) for n in others]
            time.sleep(0.5)  # every request has reached the gateway (loopback) and is held there
            waiting = gateway_lock_waiters(probe)
            holder.execute("COMMIT")
            answers = [head.result(timeout=30)] + [f.result(timeout=30) for f in sent]
            pool.shutdown()
        assert waiting == 1, f"{waiting} gateway connections waited: the calls were not held in the gateway"
        for r in answers:
            assert r.status_code == 200, r.text
            assert r.json()["applied"] is True and len(r.json()["leases"]) == 1, r.text
        with psycopg.connect(db_dsn, autocommit=True) as c:
            rows = c.execute(
                "SELECT run_id, finished_at FROM awp.dispatches WHERE dispatch_id = ANY (%s)",
                [[leases[n]["dispatch_id"] for n in others]],
            ).fetchall()
            assert len(rows) == 5 and len({t for _, t in rows}) == 1, f"not one transaction: {rows}"
            assert len({r for r, _ in rows}) == 3, f"the group spans the three runs: {rows}"
            assert one(c, "SELECT count(*) FROM awp.check_invariants()")[0] == 0  # contiguous events, counters


def test_runs_on_several_lanes_finish_with_no_server_error(db_dsn: str) -> None:
    """Real workers of one slot on six runs, three lanes of grouped calls: groups of different lanes meet each
    other's runs (a refill skips a run another transaction holds; found broken once, a 500 for the whole group).
    Every run succeeds, no request is answered 5xx, grouped calls happened, and the runs' histories stay whole."""
    with serve(db_dsn, coordinator_interval_ms=200, args=["--group-lanes", "3"]) as gw3, Workers(gw3) as ws:
        wf = apply(gw3, {"id": "grouping-lanes", "concurrency": 6, "tasks": [mock_task(f"t{i}") for i in range(40)]})
        runs = [start_run(gw3, wf) for _ in range(6)]
        for n in range(6):
            ws.start(f"lane-w{n}", concurrency=1, wait_ms=500)
        wait_until(
            lambda: all(get_run(gw3, r)["status"] in ("succeeded", "failed", "canceled") for r in runs),
            120,
            0.2,
            "the six runs finished",
        )
        assert [get_run(gw3, r)["status"] for r in runs] == ["succeeded"] * 6
        log = gw3.log_path.read_text()
        assert " status=5" not in log, gw3.log_tail(60)
        metrics = httpx.get(gw3.url("/metrics"), headers=gw3.auth("operator"), timeout=10).text
        grouped = [line for line in metrics.splitlines() if line.startswith("awp_grouped_completion_calls_total")]
        assert grouped and float(grouped[0].split()[-1]) > 0, grouped
    with psycopg.connect(db_dsn, autocommit=True) as c:
        assert one(c, "SELECT count(*) FROM awp.check_invariants()")[0] == 0
