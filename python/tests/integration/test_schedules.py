"""Schedules end to end: over HTTP with a real ``awp serve`` (its coordinator fires them) and a real worker,
the request errors, the CLI, and exactly-once firing under two concurrent coordinator passes on two real
connections (which one pgTAP transaction cannot show)."""

from __future__ import annotations

import itertools
import json
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row
from worker_support import Workers, mock_task, wait_run

from awp.dev.localdb import Server
from awp_testing.cluster import database_name, fresh_database, one
from awp_testing.gateway import ServeProcess, wait_until

API = "/api/v1"


@pytest.fixture(scope="module")
def http(gw: ServeProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gw.base_url + API, timeout=30) as client:
        yield client


def new_workflow(http: httpx.Client, gw: ServeProcess) -> str:
    wid = "sched-" + secrets.token_hex(4)
    body = {"id": wid, "tasks": [mock_task("a")]}
    headers = {**gw.auth("operator"), "Idempotency-Key": secrets.token_hex(8)}
    assert http.post("/workflows", json=body, headers=headers).status_code == 201
    return wid


def create(http: httpx.Client, gw: ServeProcess, body: dict[str, Any], role: str = "operator") -> httpx.Response:
    return http.post("/schedules", json=body, headers=gw.auth(role))


def error_code(r: httpx.Response) -> str:
    return r.json()["error"]["code"]


def runs_of(conn: psycopg.Connection, schedule_id: str) -> list[tuple[str, str]]:
    rows = conn.execute(
        "SELECT run_id, idempotency_key FROM awp.runs WHERE schedule_id = %s ORDER BY created_at", (schedule_id,)
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


# -- over HTTP ---------------------------------------------------------------------------------------------


def test_an_interval_schedule_starts_runs_until_deleted(http, gw, conn):
    wid = new_workflow(http, gw)
    sid = "every-second-" + secrets.token_hex(3)
    r = create(http, gw, {"schedule_id": sid, "workflow_id": wid, "interval_ms": 1000, "input": {"city": "Oslo"}})
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["schedule_id"] == sid and created["interval_ms"] == 1000 and created["cron"] is None
    assert created["input"] == {"city": "Oslo"} and created["timezone"] == "UTC"
    assert created["last_run_id"] is None and created["next_fire_at"] > created["created_at"]

    listed = http.get("/schedules", headers=gw.auth("viewer")).json()
    assert listed["next_cursor"] is None
    assert [s for s in listed["items"] if s["schedule_id"] == sid] == [created]

    with Workers(gw) as workers:
        workers.start("sched-worker")
        wait_until(lambda: len(runs_of(conn, sid)) >= 3, 10, 0.05, "three scheduled runs")
        run_id = runs_of(conn, sid)[0][0]
        run = wait_run(gw, run_id)
        assert run["status"] == "succeeded"
        assert run["schedule_id"] == sid and run["input"] == {"city": "Oslo"} and run["workflow_id"] == wid
        listed_runs = http.get("/runs", params={"workflow_id": wid}, headers=gw.auth("viewer")).json()["items"]
        assert listed_runs and all(x["schedule_id"] == sid for x in listed_runs)

    deleted = http.delete(f"/schedules/{sid}", headers=gw.auth("operator"))
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["schedule_id"] == sid and deleted.json()["last_run_id"] is not None
    count = len(runs_of(conn, sid))
    # Fire times are created_at + k s, one run each: the keys are distinct, whole intervals apart (a fire
    # time can only be skipped if no pass ran for a whole second: then only the latest one is started).
    fire_ms = sorted(int(key.rsplit(":", 1)[1]) for _, key in runs_of(conn, sid))
    assert len(set(fire_ms)) == count
    assert all(b > a and (b - a) % 1000 == 0 for a, b in itertools.pairwise(fire_ms)), fire_ms
    time.sleep(2.5)
    assert len(runs_of(conn, sid)) == count, "a deleted schedule started another run"
    assert sid not in [s["schedule_id"] for s in http.get("/schedules", headers=gw.auth("viewer")).json()["items"]]


def test_a_cron_schedule_with_seconds_fires_every_second(http, gw, conn):
    wid = new_workflow(http, gw)
    sid = "cron-" + secrets.token_hex(3)
    r = create(http, gw, {"schedule_id": sid, "workflow_id": wid, "cron": "* * * * * *", "timezone": "Europe/Berlin"})
    assert r.status_code == 201, r.text
    assert r.json()["timezone"] == "Europe/Berlin" and r.json()["next_fire_at"].endswith("+00:00")
    try:
        wait_until(lambda: len(runs_of(conn, sid)) >= 2, 10, 0.05, "two runs of a every-second cron")
    finally:
        http.delete(f"/schedules/{sid}", headers=gw.auth("operator"))
    keys = [key for _, key in runs_of(conn, sid)]
    assert all(int(k.rsplit(":", 1)[1]) % 1000 == 0 for k in keys), "cron fire times are whole seconds"


def test_creating_again_same_definition_is_idempotent_another_is_refused(http, gw):
    wid = new_workflow(http, gw)
    body = {"schedule_id": "again-" + secrets.token_hex(3), "workflow_id": wid, "cron": "0 9 * * MON-FRI"}
    first = create(http, gw, body)
    assert first.status_code == 201, first.text
    again = create(http, gw, {**body, "cron": "0  9 * * MON-FRI"})  # spacing does not matter
    assert again.status_code == 201 and again.json() == first.json()
    other = create(http, gw, {**body, "cron": "0 10 * * MON-FRI"})
    assert other.status_code == 400 and error_code(other) == "invalid_request"
    assert "exists" in other.json()["error"]["message"]
    assert http.delete(f"/schedules/{body['schedule_id']}", headers=gw.auth("operator")).status_code == 200


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"cron": "61 * * * *"}, "minute field"),
        ({"cron": "* * * *"}, "5 fields"),
        ({"cron": "0 0 31 2 *"}, "never fires"),
        ({"cron": "*/5 * * * *", "interval_ms": 5000}, "exactly one"),
        ({}, "exactly one"),
        ({"interval_ms": 999}, "interval_ms"),
        ({"interval_ms": 2**31}, "interval_ms"),
        ({"interval_ms": "1000"}, "interval_ms"),
        ({"interval_ms": True}, "interval_ms"),
        ({"interval_ms": 1000, "timezone": "Mars/Olympus"}, "time zone"),
        ({"interval_ms": 1000, "input": [1]}, "input"),
        ({"interval_ms": 1000, "input": {"x": "y" * 70000}}, "65536"),
        ({"interval_ms": 1000, "schedule_id": "no spaces"}, "schedule_id"),
        ({"interval_ms": 1000, "schedule_id": "s" * 129}, "schedule_id"),
        ({"interval_ms": 1000, "colour": "red"}, "unknown fields"),
    ],
)
def test_bad_schedules_are_400(http, gw, change, words):
    body = {"schedule_id": "bad", "workflow_id": "whatever", **change}
    r = create(http, gw, body)
    assert r.status_code == 400, r.text
    assert error_code(r) == "invalid_request"
    assert words in r.json()["error"]["message"]


def test_not_found_and_auth(http, gw):
    r = create(http, gw, {"schedule_id": "orphan", "workflow_id": "no-such-workflow", "interval_ms": 1000})
    assert r.status_code == 404 and error_code(r) == "not_found"
    r = http.delete("/schedules/no-such-schedule", headers=gw.auth("operator"))
    assert r.status_code == 404 and error_code(r) == "not_found"
    assert create(http, gw, {"schedule_id": "x", "workflow_id": "y", "interval_ms": 1000}, "viewer").status_code == 403
    assert http.delete("/schedules/x", headers=gw.auth("viewer")).status_code == 403
    assert http.get("/schedules").status_code == 401
    assert http.post("/schedules", content=b"[]", headers=gw.auth("operator")).status_code == 400


# -- the CLI -----------------------------------------------------------------------------------------------


def test_cli_create_list_delete(awp, http, gw, tmp_path):
    wid = new_workflow(http, gw)
    sid = "cli-" + secrets.token_hex(3)
    out = awp("schedule", "create", sid, wid, "--cron", "30 7 * * *", "--timezone", "Asia/Tokyo", "--input", '{"a": 1}')
    assert f"schedule {sid}: workflow {wid} cron '30 7 * * *' (Asia/Tokyo)" in out.output
    assert "next fire at 20" in out.output

    path = tmp_path / "input.json"
    path.write_text(json.dumps({"b": [2]}))
    second = json.loads(
        awp("schedule", "create", sid + "-2", wid, "--every-ms", "60000", "--input-file", str(path), "--json").output
    )
    assert second["interval_ms"] == 60000 and second["input"] == {"b": [2]} and second["cron"] is None

    listed = json.loads(awp("schedule", "list", "--json").output)
    mine = {s["schedule_id"]: s for s in listed if s["schedule_id"].startswith(sid)}
    assert set(mine) == {sid, sid + "-2"}
    assert mine[sid]["input"] == {"a": 1} and mine[sid]["timezone"] == "Asia/Tokyo"
    table = awp("schedule", "list").output
    assert sid in table and "every 60000 ms" in table

    assert "deleted" in awp("schedule", "delete", sid).output
    assert json.loads(awp("schedule", "delete", sid + "-2", "--json").output)["schedule_id"] == sid + "-2"
    assert not [s for s in json.loads(awp("schedule", "list", "--json").output) if s["schedule_id"].startswith(sid)]

    gone = awp("schedule", "delete", sid, ok=False)
    assert gone.exit_code == 1 and "not_found" in gone.output
    both = awp("schedule", "create", "x", wid, "--cron", "* * * * *", "--every-ms", "1000", ok=False)
    assert both.exit_code == 2 and "exactly one" in both.output
    bad = awp("schedule", "create", "x", wid, "--cron", "* * *", ok=False)
    assert bad.exit_code == 1 and "invalid_request" in bad.output
    not_object = awp("schedule", "create", "x", wid, "--every-ms", "1000", "--input", "[1]", ok=False)
    assert not_object.exit_code == 2 and "JSON object" in not_object.output


# -- exactly once under concurrent coordinator passes ----------------------------------------------------------


@pytest.fixture
def quiet_dsn(pg_cluster: Server) -> Iterator[str]:
    """A fresh database with no gateway: only this test's connections fire schedules."""
    name = database_name("schedules_race")
    dsn = fresh_database(pg_cluster, name)
    try:
        yield dsn
    finally:
        pg_cluster.drop_database(name)


def test_two_concurrent_coordinator_passes_start_exactly_one_run_per_fire_time(quiet_dsn):
    schedules = 12
    with psycopg.connect(quiet_dsn, autocommit=True) as c:
        c.execute(
            """SELECT awp.create_workflow_version('{"id": "race", "tasks": [{"key": "a", "executor": "mock"}]}')"""
        )
        for i in range(schedules):
            if i % 2:
                c.execute(
                    "SELECT awp.create_schedule(%s, 'race', interval_ms => 1000, input => %s)",
                    (f"s{i}", json.dumps({"i": i})),
                )
            else:
                c.execute(
                    "SELECT awp.create_schedule(%s, 'race', '* * * * * *', input => %s)",
                    (f"s{i}", json.dumps({"i": i})),
                )

    started: list[int] = []
    errors: list[BaseException] = []
    stop = time.monotonic() + 3.5
    barrier = threading.Barrier(2)

    def passes(call: str) -> None:
        total = 0
        try:
            with psycopg.connect(quiet_dsn, autocommit=True) as c:
                barrier.wait()
                while time.monotonic() < stop:
                    value = one(c, call)[0]
                    total += value if isinstance(value, int) else value["schedules_fired"]
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        started.append(total)

    threads = [
        threading.Thread(target=passes, args=("SELECT awp.fire_schedules()",)),
        threading.Thread(target=passes, args=("SELECT awp.coordinator_tick()",)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors

    with psycopg.connect(quiet_dsn, autocommit=True, row_factory=dict_row) as reader:
        runs = reader.execute("SELECT schedule_id, idempotency_key, input FROM awp.runs").fetchall()
        rows = {s["schedule_id"]: s for s in reader.execute("SELECT * FROM awp.list_schedules()").fetchall()}
    # Every run started was counted by exactly one pass: a fire time started twice (or started by one
    # pass and only found by the other) would make the counts and the runs disagree.
    assert sum(started) == len(runs)
    by_schedule: dict[str, list[int]] = {}
    for run in runs:
        sid = run["schedule_id"]
        prefix, fired_sid, ms = run["idempotency_key"].split(":")
        assert prefix == "schedule" and fired_sid == sid
        assert run["input"] == {"i": int(sid[1:])}
        by_schedule.setdefault(sid, []).append(int(ms))
    assert set(by_schedule) == set(rows), "every schedule fired"
    for sid, fires in by_schedule.items():
        assert len(fires) == len(set(fires)), f"{sid}: a fire time was started twice"
        fires.sort()
        # Whole seconds apart (passes run back to back, so normally exactly 1000 ms; a stall of the machine
        # over a second legitimately skips to the latest fire time).
        assert all(b > a and (b - a) % 1000 == 0 for a, b in itertools.pairwise(fires)), (sid, fires)
        assert len(fires) >= 3, (sid, fires)
        assert int(rows[sid]["last_fired_at"].timestamp() * 1000) == fires[-1]
