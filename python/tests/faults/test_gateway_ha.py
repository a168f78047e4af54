"""High availability of the control plane: one active coordinator among replicas, automatic failover
after kill -9, and a gateway that survives a database restart without being restarted itself."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from awp_testing.cluster import database_name, fresh_database, local_cluster
from awp_testing.gateway import PROTOCOL, ServeProcess, Tokens, bearer, serve, start_serve, wait_until

pytestmark = pytest.mark.slow  # multi-process / long: make test-fast skips it

API = "/api/v1"


def configure_fast(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT awp.configure(lease_duration_ms => 2000, heartbeat_interval_ms => 200)")


def start_run(gw: ServeProcess, tasks: list[dict[str, Any]]) -> str:
    wid = "ha-" + secrets.token_hex(4)
    op = gw.auth("operator")
    r = httpx.post(gw.api("/workflows"), json={"id": wid, "tasks": tasks}, headers={**op, "Idempotency-Key": wid})
    assert r.status_code == 201, r.text
    r = httpx.post(gw.api(f"/workflows/{wid}/versions/1/runs"), headers={**op, "Idempotency-Key": wid})
    assert r.status_code == 202, r.text
    return r.json()["run_id"]


def register(gw: ServeProcess) -> tuple[str, dict[str, str]]:
    r = httpx.post(gw.api("/workers/register"), json={"executor_kinds": ["mock"]}, headers=gw.auth("bootstrap"))
    assert r.status_code == 201, r.text
    return r.json()["worker_id"], {**bearer(r.json()["session_token"]), **PROTOCOL}


def run_status(gw: ServeProcess, run_id: str) -> str:
    return httpx.get(gw.api(f"/runs/{run_id}"), headers=gw.auth("viewer"), timeout=5).json()["status"]


def work_until_done(gw: ServeProcess, run_id: str, timeout: float = 20.0) -> None:
    """Act as a worker over HTTP: claim, complete, repeat until the run is terminal."""
    worker_id, headers = register(gw)
    deadline = time.monotonic() + timeout
    while run_status(gw, run_id) not in ("succeeded", "failed", "canceled"):
        assert time.monotonic() < deadline, "run did not finish"
        r = httpx.post(gw.api(f"/workers/{worker_id}/claims"), json={"slots": 1, "wait_ms": 1000}, headers=headers)
        assert r.status_code == 200, r.text
        for lease in r.json()["leases"]:
            body = {"lease_token": lease["lease_token"], "result": {"kind": "success"}}
            done = httpx.post(
                gw.api(f"/workers/{worker_id}/leases/{lease['dispatch_id']}/complete"), json=body, headers=headers
            )
            assert done.status_code == 200, done.text
    assert run_status(gw, run_id) == "succeeded"


@pytest.fixture
def two_gateways(db_dsn: str) -> Iterator[tuple[ServeProcess, ServeProcess]]:
    configure_fast(db_dsn)
    tokens = Tokens()
    a = start_serve(db_dsn, tokens=tokens, coordinator_interval_ms=100)
    try:
        b = start_serve(db_dsn, tokens=tokens, coordinator_interval_ms=100)
        try:
            yield a, b
        finally:
            b.stop()
    finally:
        a.stop()


def actives(*gws: ServeProcess) -> list[bool]:
    return [gw.coordinator_active() for gw in gws]


def test_exactly_one_of_two_gateways_is_the_active_coordinator(two_gateways):
    a, b = two_gateways
    wait_until(lambda: sum(actives(a, b)) == 1, what="one active coordinator")
    for _ in range(10):  # and it stays that way
        assert sum(actives(a, b)) == 1
        time.sleep(0.05)


def test_killing_the_active_coordinator_hands_over_and_the_run_still_finishes(two_gateways):
    a, b = two_gateways
    wait_until(lambda: sum(actives(a, b)) == 1, what="one active coordinator")
    leader, standby = (a, b) if a.coordinator_active() else (b, a)
    run_id = start_run(
        leader,
        [
            {"key": "a", "executor": "mock"},
            {"key": "b", "executor": "mock", "depends_on": ["a"]},
            {"key": "c", "executor": "mock", "depends_on": ["b"]},
        ],
    )
    # A worker holds a lease through the leader; then the leader is killed mid-run.
    worker_id, headers = register(leader)
    lease = httpx.post(
        leader.api(f"/workers/{worker_id}/claims"), json={"slots": 1, "wait_ms": 5000}, headers=headers
    ).json()["leases"][0]
    leader.kill()
    # The timeout only bounds a hang: the standby's next attempt at the advisory lock takes over.
    wait_until(standby.coordinator_active, timeout=15, what="the standby to take over")
    # The worker keeps going through the surviving gateway; its lease is still valid there.
    body = {"lease_token": lease["lease_token"], "result": {"kind": "success"}}
    r = httpx.post(
        standby.api(f"/workers/{worker_id}/leases/{lease['dispatch_id']}/complete"), json=body, headers=headers
    )
    assert r.json() == {"applied": True}
    work_until_done(standby, run_id)


def test_a_restarted_database_is_survived_without_restarting_the_gateway():
    with local_cluster() as server:  # its own cluster, even with AWP_TEST_DSN: the test stops it
        name = database_name("restart")
        dsn = fresh_database(server, name)
        configure_fast(dsn)
        with serve(dsn, coordinator_interval_ms=100) as gw:
            wait_until(gw.coordinator_active, what="coordinator active")
            run_id = start_run(gw, [{"key": "a", "executor": "mock"}])
            server.stop(mode="fast")
            down = wait_until(
                lambda: (r := gw.health()) is not None and r.status_code == 503 and r,
                timeout=15,
                what="/health/ready to say 503",
            )
            assert down.json()["database"] == "unreachable"
            r = httpx.get(gw.api("/runs"), headers=gw.auth("viewer"), timeout=15)
            assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
            assert gw.alive()
            server.start(fsync=False)
            wait_until(gw.ready, timeout=30, interval=0.1, what="/health/ready to recover")
            wait_until(gw.coordinator_active, timeout=15, what="the coordinator to resume")
            r = httpx.get(gw.api("/runs"), headers=gw.auth("viewer"), timeout=15)
            assert r.status_code == 200
            work_until_done(gw, run_id)
            assert gw.alive()
