"""PostgreSQL high availability under Patroni (issue 16): a primary failover and a planned switchover while
20 runs x 50 tasks are in flight, with no acknowledged result lost.

Real etcd, real Patroni, real synchronous streaming replication (``ha_support``); two real ``awp serve``
replicas and three real ``awp worker`` processes, all connected through one multi-host DSN with
``target_session_attrs=read-write``. Workers append every completion the gateway acknowledged to a file
(``AWP_WORKER_ACK_LOG``). The scenario:

1. kill -9 of the primary's postmaster mid-run; Patroni promotes the synchronous standby;
2. the gateways' pools, LISTEN connections and coordinators find the new primary by themselves (same
   processes, no restart); the old primary comes back as synchronous standby (pg_rewind when needed);
3. a planned switchover back to the first node (Patroni's REST API, as ``patronictl switchover`` does);
4. afterwards: every acknowledged completion is in the database (dispatch ``completed`` with that attempt,
   the attempt settled the way the worker reported), every run succeeded, ``awp.check_invariants()`` is
   empty (also when sampled during the scenario), and every write the probe saw acknowledged exists.

It prints one summary line (``make ha-test`` runs only this scenario) and merges its figures into
``benchmarks/results/faults.json`` under ``16_patroni_failover``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fault_support import InvariantSampler, configure, query, record
from ha_support import PatroniCluster, WriteProbe, patroni_cluster
from psycopg.rows import dict_row
from worker_support import Workers, apply, mock_task, start_run, wait_run

from awp.dev.localdb import ExternalServer
from awp_testing.cluster import fresh_database
from awp_testing.gateway import ServeProcess, Tokens, serve, wait_until

RUNS = 20
TASKS = 50
SLEEP_MS = 300  # per task: with 3 workers x 4 slots the runs last ~30 s, long enough for both events
WORKER_CONCURRENCY = 4
# A lease must outlast the database outage so that work in flight is completed, not reaped and retried: the
# failover here takes 4-6 s (kill -> writes accepted), up to ~9 s when the old primary needs pg_rewind before
# it can be the synchronous standby again, so 20 s leases; heartbeats every second; a worker is marked
# offline after 20 silent heartbeats (and a coordinator's first pass after a reconnect restarts that window).
LEASE_MS = 20_000
HEARTBEAT_MS = 1_000
OFFLINE_AFTER_HEARTBEATS = 20
KILL_AT = 0.15  # fraction of the tasks succeeded when the primary is killed


def _count(dsn: str, sql: str, params: Any = ()) -> int:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as c:
        row = c.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


def succeeded_tasks(dsn: str) -> int:
    return _count(dsn, "SELECT count(*) FROM awp.tasks WHERE status = 'succeeded'")


def all_ready(gateways: list[ServeProcess]) -> bool:
    return all(gw.ready() is not None for gw in gateways)


def control_plane_whole(gateways: list[ServeProcess]) -> bool:
    """Both gateways ready with their LISTEN connection up, and exactly one active coordinator."""
    states = [gw.ready() for gw in gateways]
    if any(s is None for s in states):
        return False
    return all(s["dispatch_listener"] == "connected" for s in states if s) and (
        sum(1 for s in states if s and s["coordinator_active"]) == 1
    )


def timed(
    predicate: Callable[[], Any], since: float, timeout: float, what: str, gateways: list[ServeProcess], dsn: str
) -> float:
    """Wait for ``predicate``; seconds from ``since`` until it held. On a timeout the error shows what each
    gateway's /health/ready says, the end of its log (without the access log) and who holds advisory locks."""
    try:
        wait_until(predicate, timeout, 0.02, what)
    except TimeoutError as e:
        parts = [str(e)]
        for gw in gateways:
            lines = [x for x in gw.log_path.read_text(errors="replace").splitlines() if "gateway.access" not in x]
            health = r.text if (r := gw.health()) else "no answer"
            parts.append(f"--- gateway {gw.port} (pid {gw.pid}): {health}\n" + "\n".join(lines[-40:]))
        try:
            parts.append(f"--- advisory locks: {query(dsn, ADVISORY_LOCKS)}")
        except psycopg.Error as db_error:
            parts.append(f"--- advisory locks: {db_error}")
        raise TimeoutError("\n".join(parts)) from None
    return time.monotonic() - since


ADVISORY_LOCKS = (
    "SELECT l.pid, l.granted, a.application_name, a.state, a.wait_event, a.backend_start, a.client_port, "
    "left(a.query, 80) AS query FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory'"
)


def read_acks(paths: list[Path]) -> list[dict[str, Any]]:
    acks: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            acks.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return acks


def lost_acks(dsn: str, acks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Acknowledged completions the database does not hold: the dispatch must be ``completed`` with the
    acknowledged attempt, and that attempt settled as reported (success -> ``succeeded``)."""
    settled = {"success": "succeeded", "temporary_failure": "failed", "permanent_failure": "failed"}
    rows = query(
        dsn,
        "SELECT d.dispatch_id, d.status, d.attempt, a.status AS attempt_status FROM awp.dispatches d "
        "LEFT JOIN awp.attempts a ON a.dispatch_id = d.dispatch_id WHERE d.dispatch_id = ANY(%s)",
        ([a["dispatch_id"] for a in acks],),
    )
    by_id = {r["dispatch_id"]: r for r in rows}
    lost = []
    for ack in acks:
        row = by_id.get(ack["dispatch_id"])
        if (
            row is None
            or row["status"] != "completed"
            or row["attempt"] != ack["attempt"]
            or row["attempt_status"] != settled.get(ack["kind"])
        ):
            lost.append({**ack, "in_database": row})
    return lost


def summary_line(f: dict[str, Any]) -> str:
    return (
        f"ha: failover {f['failover_s']:.1f} s (primary killed -> new primary), "
        f"gateways ready {f['gateways_ready_after_failover_s']:.1f} s later; "
        f"switchover {f['switchover_s']:.1f} s; "
        f"runs {f['runs_succeeded']}/{f['runs']} succeeded; "
        f"acknowledged completions lost {f['acknowledged_completions_lost']}; "
        f"invariant violations {f['invariant_violations']}"
    )


def test_ack_log_records_each_acknowledged_completion(db_dsn: str, tmp_path: Path) -> None:
    """The worker's ``AWP_WORKER_ACK_LOG`` hook: one line per acknowledged completion, matching the database."""
    path = tmp_path / "acks.jsonl"
    with serve(db_dsn) as gw, Workers(gw) as workers:
        workers.start("ack-log", env={"AWP_WORKER_ACK_LOG": str(path)})
        run_id = start_run(gw, apply(gw, {"id": "ack-log", "tasks": [mock_task(f"t{i}") for i in range(3)]}))
        assert wait_run(gw, run_id)["status"] == "succeeded"
        wait_until(lambda: len(read_acks([path])) == 3, 10, 0.05, "three acknowledged completions")
    acks = read_acks([path])
    assert {a["task_key"] for a in acks} == {"t0", "t1", "t2"}
    assert all(a["applied"] is True and a["kind"] == "success" and a["run_id"] == run_id for a in acks)
    assert lost_acks(db_dsn, acks) == []
    assert lost_acks(db_dsn, [{**acks[0], "attempt": 2}]) != [], "the check must notice a wrong attempt"
    assert lost_acks(db_dsn, [{**acks[0], "dispatch_id": "dsp_gone"}]) != [], "and a missing dispatch"
    assert lost_acks(db_dsn, [{**acks[0], "kind": "permanent_failure"}]) != [], "and another outcome"


@pytest.mark.slow
def test_patroni_failover_and_switchover_lose_nothing(tmp_path: Path) -> None:
    keep = bool(os.environ.get("AWP_HA_KEEP"))  # keep the cluster's directory (Patroni and etcd logs)
    with ExitStack() as stack:
        ha = stack.enter_context(patroni_cluster(keep=keep))
        figures = scenario(ha, stack, tmp_path)
    record("16_patroni_failover", **figures)  # every figure, and into benchmarks/results/faults.json
    print("\n" + summary_line(figures), flush=True)
    assert figures["acknowledged_completions_lost"] == 0, figures["lost_examples"]
    assert figures["probe_writes_lost"] == 0
    assert figures["invariant_violations"] == 0, figures["violation_examples"]
    assert figures["runs_succeeded"] == RUNS, figures["run_statuses"]
    assert figures["worker_exit_codes"] == [0, 0, 0], "workers did not drain cleanly (see their logs above)"
    acknowledged = figures["tasks_acknowledged"]
    assert acknowledged >= 0.9 * RUNS * TASKS, f"only {acknowledged} tasks acknowledged: is AWP_WORKER_ACK_LOG written?"


def scenario(ha: PatroniCluster, stack: ExitStack, tmp_path: Path) -> dict[str, Any]:
    first, _ = ha.wait_whole()
    dsn = fresh_database(ExternalServer(ha.dsn("postgres")), "awp")
    assert "target_session_attrs=read-write" in dsn and dsn.count("127.0.0.1") == 2, dsn
    configure(dsn, LEASE_MS, HEARTBEAT_MS, offline_after_heartbeats=OFFLINE_AFTER_HEARTBEATS)

    tokens = Tokens()
    gateways = [stack.enter_context(serve(dsn, tokens=tokens)) for _ in range(2)]
    pids = [gw.pid for gw in gateways]
    ack_paths = [tmp_path / f"acks-w{i}.jsonl" for i in range(3)]
    workers = []
    for i, path in enumerate(ack_paths):  # two workers on the first gateway, one on the second
        pool = stack.enter_context(Workers(gateways[0 if i < 2 else 1]))
        workers.append(pool.start(f"ha-w{i}", concurrency=WORKER_CONCURRENCY, env={"AWP_WORKER_ACK_LOG": str(path)}))
    for w in workers:
        w.wait_log("registered as", timeout=20)

    probe = stack.enter_context(WriteProbe(ha.dsn("postgres")))
    sampler = stack.enter_context(InvariantSampler(dsn, interval=0.2))
    tasks = [mock_task(f"t{i:02}", max_attempts=3, sleep_ms=SLEEP_MS) for i in range(TASKS)]
    workflow = apply(gateways[0], {"id": "ha", "concurrency": TASKS, "tasks": tasks})
    run_ids = [start_run(gateways[i % 2], workflow) for i in range(RUNS)]
    total = RUNS * TASKS
    started = time.monotonic()

    # -- 1. kill -9 of the primary's postmaster mid-run -----------------------------------------------------
    wait_until(lambda: succeeded_tasks(dsn) >= KILL_AT * total, 90, 0.1, f"{KILL_AT:.0%} of the tasks done")
    done_at_kill = succeeded_tasks(dsn)
    killed_pid = ha.kill_postmaster(first)
    killed = time.monotonic()
    new = ha.wait_leader(30, other_than=first)
    promoted_s = time.monotonic() - killed
    failover_s = probe.wait_write(killed, new.pg_port, 60) - killed
    writable = killed + failover_s
    ready_s = timed(lambda: all_ready(gateways), writable, 60, "both gateways ready after the failover", gateways, dsn)
    control_plane_s = timed(
        lambda: control_plane_whole(gateways), writable, 60, "listeners and a coordinator", gateways, dsn
    )
    _, back = ha.wait_whole(90)
    assert back is first, f"{first.name} should be back as synchronous standby"
    whole_s = time.monotonic() - killed
    assert first.postmaster_pid() not in (None, killed_pid)
    done_after_failover = succeeded_tasks(dsn)
    wait_until(lambda: succeeded_tasks(dsn) >= done_after_failover + 50, 60, 0.1, "progress on the new primary")

    # -- 2. planned switchover back to the first node --------------------------------------------------------
    done_at_switchover = succeeded_tasks(dsn)
    assert done_at_switchover < total, "the runs ended before the switchover: make the tasks longer"
    requested = time.monotonic()
    answer = ha.switchover(new, first)
    assert answer.status_code == 200, f"switchover: {answer.status_code} {answer.text}"
    switchover_s = probe.wait_write(requested, first.pg_port, 60) - requested
    switched = requested + switchover_s
    last_on_old = probe.last_write_before(switched)
    sw_ready_s = timed(
        lambda: all_ready(gateways), switched, 60, "both gateways ready after the switchover", gateways, dsn
    )
    sw_control_plane_s = timed(
        lambda: control_plane_whole(gateways), switched, 60, "listeners and a coordinator", gateways, dsn
    )
    assert ha.wait_whole(90) == (first, new)

    # -- 3. the runs finish; nothing acknowledged is lost ----------------------------------------------------
    wait_until(
        lambda: _count(dsn, "SELECT count(*) FROM awp.runs WHERE status IN ('pending', 'running')") == 0,
        180,
        0.2,
        "every run to end",
    )
    elapsed = time.monotonic() - started
    for w in workers:
        assert w.alive(), f"{w.name} exited during the scenario:\n{w.log()[-3000:]}"
        w.signal(signal.SIGTERM)
    exits = [w.wait_exit(30) for w in workers]
    for gw, pid in zip(gateways, pids, strict=True):
        assert gw.alive() and gw.pid == pid, f"gateway {pid} did not survive:\n{gw.log_tail()}"
    sampled = sampler.stop()
    probe.stop()

    acks = read_acks(ack_paths)
    lost = lost_acks(dsn, acks)
    statuses = {r["run_id"]: r["status"] for r in query(dsn, "SELECT run_id, status FROM awp.runs")}
    final = query(dsn, "SELECT * FROM awp.check_invariants()")
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
        retried = c.execute("SELECT count(*) AS n FROM awp.attempts WHERE attempt > 1").fetchone()
        succeeded_attempts = c.execute("SELECT count(*) AS n FROM awp.attempts WHERE status = 'succeeded'").fetchone()
    acked_success = {(a["run_id"], a["task_key"]) for a in acks if a["kind"] == "success"}
    return {
        "failover_s": round(failover_s, 2),
        "promoted_s": round(promoted_s, 2),
        "gateways_ready_after_failover_s": round(ready_s, 2),
        "listeners_and_coordinator_after_failover_s": round(control_plane_s, 2),
        "old_primary_back_as_sync_standby_s": round(whole_s, 2),
        "switchover_s": round(switchover_s, 2),
        "switchover_write_gap_s": round(switched - last_on_old, 2) if last_on_old else None,
        "gateways_ready_after_switchover_s": round(sw_ready_s, 2),
        "listeners_and_coordinator_after_switchover_s": round(sw_control_plane_s, 2),
        "tasks_done_at_kill": done_at_kill,
        "tasks_done_at_switchover": done_at_switchover,
        "runs": RUNS,
        "tasks": total,
        "runs_succeeded": sum(1 for r in run_ids if statuses.get(r) == "succeeded"),
        "run_statuses": sorted(set(statuses.values())),
        "scenario_s": round(elapsed, 1),
        "acknowledged_completions": len(acks),
        "tasks_acknowledged": len(acked_success),
        "worker_exit_codes": exits,
        "acknowledged_completions_lost": len(lost),
        "lost_examples": lost[:5],
        "succeeded_attempts_not_acknowledged": int(succeeded_attempts["n"]) - len(acked_success)
        if succeeded_attempts
        else None,
        "attempts_retried": int(retried["n"]) if retried else None,
        "probe_writes": len(probe.acked),
        "probe_writes_lost": len(probe.lost()),
        "invariant_samples": sampler.samples,
        "invariant_violations": len(final) + len(sampled),
        "violation_examples": [str(v) for v in (final + sampled)[:5]],
        "lease_ms": LEASE_MS,
        "heartbeat_ms": HEARTBEAT_MS,
        "fsync": ha.fsync,
    }
