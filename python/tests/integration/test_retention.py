"""Retention and paging against a real ``awp serve`` and PostgreSQL (docs/retention.md).

- Every list route pages: ``limit`` (1-100, default 50), an opaque ``cursor``, ``next_cursor`` null on the
  last page, 400 for a malformed cursor or limit, pages stable while rows are added; the CLI follows cursors.
- ``awp prune --older-than`` (durations 30s, 15m, 12h, 7d); pruned ids answer 404; an idempotency key replayed
  after its run was pruned starts a new run; prune skips (never waits for) a run another transaction holds.
- The active coordinator applies ``retention_ms`` in the background; ``/metrics`` stays bounded with 20,000
  finished runs (its run counts come from maintained counters, not from counting every run).
"""

from __future__ import annotations

import base64
import json
import secrets
import statistics
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from awp.cli.retention import parse_duration
from awp.dev.procs import awp_command
from awp_testing.cluster import one
from awp_testing.gateway import PROTOCOL, ServeProcess, bearer, wait_until

API = "/api/v1"


GATEWAY_OPTIONS = {"env": {"AWP_RETENTION_INTERVAL_MS": "200"}}


@pytest.fixture(scope="module")
def http(gw: ServeProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gw.base_url, timeout=30, headers=gw.auth("operator")) as client:
        yield client


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json()


def workflow(http: httpx.Client, tasks: int = 1, wid: str | None = None) -> str:
    wid = wid or "ret-" + secrets.token_hex(4)
    body = {"id": wid, "tasks": [{"key": f"t{i:03d}", "executor": "mock"} for i in range(tasks)]}
    ok(http.post(f"{API}/workflows", json=body, headers={"Idempotency-Key": secrets.token_hex(8)}), 201)
    return wid


def start(http: httpx.Client, wid: str, key: str | None = None) -> str:
    headers = {"Idempotency-Key": key or secrets.token_hex(8)}
    return ok(http.post(f"{API}/workflows/{wid}/versions/1/runs", json={}, headers=headers), 202)["run_id"]


def register(http: httpx.Client, gw: ServeProcess, name: str = "w") -> dict[str, Any]:
    body = {"display_name": name, "executor_kinds": ["mock"], "max_concurrency": 1}
    return ok(http.post(f"{API}/workers/register", json=body, headers=gw.auth("bootstrap")), 201)


def pages(http: httpx.Client, path: str, limit: int | None = None, **params: Any) -> list[dict[str, Any]]:
    """Every page of a list route (each checked for shape and size)."""
    out: list[dict[str, Any]] = []
    cursor = None
    for _ in range(10_000):
        query = {**params, **({"limit": limit} if limit else {}), **({"cursor": cursor} if cursor else {})}
        answer = ok(http.get(API + path, params=query))
        assert set(answer) == {"items", "next_cursor"}
        assert len(answer["items"]) <= (limit or 50)
        out.append(answer)
        cursor = answer["next_cursor"]
        if cursor is None:
            return out
        assert isinstance(cursor, str) and cursor
        assert len(answer["items"]) == (limit or 50), "a page followed by another is full"
    raise AssertionError("no last page")


def items(http: httpx.Client, path: str, limit: int | None = None, **params: Any) -> list[dict[str, Any]]:
    return [item for page in pages(http, path, limit, **params) for item in page["items"]]


def sql(dsn: str, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(query, params).fetchall()


def awp_cli(dsn: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        awp_command(*args),
        env={"AWP_DATABASE_URL": dsn, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def finish_all(dsn: str) -> None:
    """Cancel every live run (converged at once when nothing is leased)."""
    sql(dsn, "SELECT awp.request_cancel(run_id) FROM awp.runs WHERE status IN ('pending', 'running')")


# -- paging ------------------------------------------------------------------------------------------------


def test_every_list_route_pages_with_limit_cursor_and_a_null_cursor_at_the_end(http, gw, db_dsn):
    wid = workflow(http, tasks=7)
    for v in range(2, 6):  # versions 2..5
        body = {"id": wid, "concurrency": v, "tasks": [{"key": "a", "executor": "mock"}]}
        ok(http.post(f"{API}/workflows", json=body, headers={"Idempotency-Key": secrets.token_hex(8)}), 201)
    runs = [start(http, wid) for _ in range(5)]
    for i in range(5):
        register(http, gw, f"pager-{i}")
        body = {"schedule_id": f"pg-{wid}-{i}", "workflow_id": wid, "interval_ms": 3_600_000}
        ok(http.post(f"{API}/schedules", json=body), 201)
    for _ in range(4):
        workflow(http)
    expected = [
        ("/workflows", "workflow_id", [r[0] for r in sql(db_dsn, "SELECT workflow_id FROM awp.list_workflows()")]),
        (f"/workflows/{wid}/versions", "version", [1, 2, 3, 4, 5]),
        ("/runs", "run_id", [r[0] for r in sql(db_dsn, "SELECT run_id FROM awp.list_runs(NULL, NULL, NULL, 1000)")]),
        (f"/runs/{runs[0]}/tasks", "task_key", [f"t{i:03d}" for i in range(7)]),
        (
            f"/runs/{runs[0]}/events",
            "sequence",
            [r[0] for r in sql(db_dsn, "SELECT sequence FROM awp.run_events(%s)", (runs[0],))],
        ),
        ("/schedules", "schedule_id", [r[0] for r in sql(db_dsn, "SELECT schedule_id FROM awp.list_schedules()")]),
        ("/workers", "worker_id", [r[0] for r in sql(db_dsn, "SELECT worker_id FROM awp.list_workers()")]),
    ]
    for path, field, want in expected:
        assert len(want) >= 5, path
        for limit in (1, 2, 3, 100):
            got = pages(http, path, limit)
            assert [item[field] for page in got for item in page["items"]] == want, (path, limit)
            assert len(got) == max(1, -(-len(want) // limit)), (path, limit)  # no empty last page
        assert [item[field] for item in items(http, path)] == want, path  # default limit


def test_the_default_limit_is_50_and_the_largest_100(http, gw):
    wid = workflow(http, tasks=120)
    run_id = start(http, wid)
    first = ok(http.get(f"{API}/runs/{run_id}/tasks"))
    assert len(first["items"]) == 50 and first["next_cursor"]
    assert len(ok(http.get(f"{API}/runs/{run_id}/tasks", params={"limit": 100}))["items"]) == 100
    rest = ok(http.get(f"{API}/runs/{run_id}/tasks", params={"cursor": first["next_cursor"], "limit": 100}))
    assert [t["task_key"] for t in rest["items"]] == [f"t{i:03d}" for i in range(50, 120)]
    assert rest["next_cursor"] is None


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "path",
    [
        "/workflows",
        "/workflows/{wid}/versions",
        "/runs",
        "/runs/{run}/tasks",
        "/runs/{run}/events",
        "/schedules",
        "/workers",
    ],
)
def test_bad_limits_and_malformed_cursors_are_400(http, gw, path):
    wid = workflow(http)
    path = API + path.format(wid=wid, run=start(http, wid))
    for limit in ("0", "101", "-1", "x", "1.5"):
        r = http.get(path, params={"limit": limit})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", (path, limit)
    bad = ["%%%", "!", "a b", _b64("[1, 2, 3, 4, 5]"), _b64("{}"), _b64('["x", '), _b64("[null]"), _b64("[true]")]
    if not path.endswith("/events"):
        bad.append("12")  # an events cursor (a sequence) is no cursor of another route
    for cursor in bad:
        r = http.get(path, params={"cursor": cursor})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", (path, cursor, r.text)


def test_a_task_cursor_naming_no_task_of_the_run_is_400(http, gw):
    run_id = start(http, workflow(http, tasks=3))
    cursor = ok(http.get(f"{API}/runs/{run_id}/tasks", params={"limit": 1}))["next_cursor"]
    assert [t["task_key"] for t in ok(http.get(f"{API}/runs/{run_id}/tasks", params={"cursor": cursor}))["items"]] == [
        "t001",
        "t002",
    ]
    wid = "ret-" + secrets.token_hex(4)
    body = {"id": wid, "tasks": [{"key": "other", "executor": "mock"}]}
    ok(http.post(f"{API}/workflows", json=body, headers={"Idempotency-Key": secrets.token_hex(8)}), 201)
    r = http.get(f"{API}/runs/{start(http, wid)}/tasks", params={"cursor": cursor})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"


def test_pages_are_stable_while_rows_are_added(http, gw):
    """Workers are listed oldest first (new ones come at the end), runs newest first (new ones come before the
    cursor): either way each row present at the start is seen exactly once."""
    for _ in range(6):
        register(http, gw)
    before = [w["worker_id"] for w in items(http, "/workers", 100)]
    seen: list[str] = []
    cursor = None
    while True:
        page = ok(http.get(f"{API}/workers", params={"limit": 2, **({"cursor": cursor} if cursor else {})}))
        seen += [w["worker_id"] for w in page["items"]]
        register(http, gw, "added-while-paging")
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)), "no worker twice"
    assert seen[: len(before)] == before, "every worker of the start, in order, before the ones added"

    wid = workflow(http)
    original = [start(http, wid) for _ in range(7)][::-1]
    seen, cursor = [], None
    while True:
        params = {"workflow_id": wid, "limit": 3, **({"cursor": cursor} if cursor else {})}
        page = ok(http.get(f"{API}/runs", params=params))
        seen += [r["run_id"] for r in page["items"]]
        start(http, wid)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == original


def test_the_cli_follows_cursors(http, gw, db_dsn):
    sql(db_dsn, "SELECT awp.register_worker('bulk', '{mock}', 1) FROM generate_series(1, 130)")
    out = subprocess.run(
        awp_command("workers", "--json"),
        env={"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": gw.tokens.operator, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    listed = [w["worker_id"] for w in json.loads(out.stdout)]
    assert listed == [r[0] for r in sql(db_dsn, "SELECT worker_id FROM awp.list_workers()")]
    assert len(listed) > 130


# -- prune ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("30s", 30_000),
        ("15m", 900_000),
        ("12h", 43_200_000),
        ("7d", 604_800_000),
        ("2w", 1_209_600_000),
        ("500ms", 500),
        ("1d12h", 129_600_000),
        ("0s", 0),
        (" 7D ", 604_800_000),
    ],
)
def test_durations(text, ms):
    assert parse_duration(text).total_seconds() * 1000 == ms


@pytest.mark.parametrize("text", ["", "7", "7x", "-1d", "d", "1.5h", "7 days", "101000d"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_prune_by_cli_and_pruned_ids_answer_404(http, gw, db_dsn):
    wid = workflow(http, tasks=2)
    key = "key-" + secrets.token_hex(4)
    run_id = start(http, wid, key)
    worker = register(http, gw, "to-prune")
    ok(
        http.post(
            f"{API}/workers/{worker['worker_id']}/drain",
            json={},
            headers={**bearer(worker["session_token"]), **PROTOCOL},
        )
    )
    finish_all(db_dsn)
    assert ok(http.get(f"{API}/runs/{run_id}"))["status"] == "canceled"
    live = start(http, wid)  # pending: never pruned

    kept = awp_cli(db_dsn, "prune", "--older-than", "7d", "--json")
    assert kept.returncode == 0, kept.stderr
    assert json.loads(kept.stdout)["runs"] == 0 and ok(http.get(f"{API}/runs/{run_id}"))

    time.sleep(0.01)
    out = awp_cli(db_dsn, "prune", "--older-than", "0s")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("pruned ") and " runs (" in out.stdout and "worker session" in out.stdout, out.stdout
    for path in (
        f"/runs/{run_id}",
        f"/runs/{run_id}/tasks",
        f"/runs/{run_id}/events",
        f"/runs/{run_id}/tasks/t000",
        f"/workers/{worker['worker_id']}",
    ):
        r = http.get(API + path)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", path
    assert ok(http.get(f"{API}/runs/{live}"))["status"] in ("pending", "running")
    assert sql(db_dsn, "SELECT * FROM awp.check_invariants()") == []

    # The key's record went with the run: a replay is a new request now (docs/retention.md).
    again = ok(http.post(f"{API}/workflows/{wid}/versions/1/runs", json={}, headers={"Idempotency-Key": key}), 202)[
        "run_id"
    ]
    assert again != run_id and ok(http.get(f"{API}/runs/{again}"))["status"] in ("pending", "running")

    bad = awp_cli(db_dsn, "prune", "--older-than", "soon")
    assert bad.returncode == 2 and "duration" in bad.stderr
    finish_all(db_dsn)


def test_prune_skips_a_run_another_transaction_holds_and_does_not_wait(http, gw, db_dsn):
    wid = workflow(http)
    held, free = start(http, wid), start(http, wid)
    finish_all(db_dsn)
    with psycopg.connect(db_dsn) as holder:
        holder.execute("SELECT 1 FROM awp.runs WHERE run_id = %s FOR UPDATE", (held,))
        with psycopg.connect(db_dsn, autocommit=True) as c:
            c.execute("SET statement_timeout = '5s'")
            started = time.monotonic()
            answer = one(c, "SELECT awp.prune('0')")[0]
            assert time.monotonic() - started < 3
            assert c.execute("SELECT run_id FROM awp.runs WHERE run_id IN (%s, %s)", (held, free)).fetchall() == [
                (held,)
            ]
            assert answer["runs"] >= 1
        holder.rollback()
    sql(db_dsn, "SELECT awp.prune('0')")
    assert sql(db_dsn, "SELECT count(*) FROM awp.runs WHERE run_id = %s", (held,)) == [(0,)]


# -- background retention and bounded metrics ---------------------------------------------------------------


def test_the_coordinator_applies_retention_in_the_background(http, gw, db_dsn):
    wid = workflow(http)
    sql(db_dsn, "SELECT awp.configure(retention_ms => 0)")
    run_id = start(http, wid)
    finish_all(db_dsn)
    time.sleep(1.0)  # several retention intervals (200 ms here): retention 0 keeps everything
    assert ok(http.get(f"{API}/runs/{run_id}"))["status"] == "canceled"
    live = start(http, wid)
    try:
        settings = sql(db_dsn, "SELECT awp.configure(retention_ms => 500)")[0][0]
        assert settings["retention_ms"] == 500
        wait_until(lambda: http.get(f"{API}/runs/{run_id}").status_code == 404, 15, 0.1, "the run to be pruned")
        assert ok(http.get(f"{API}/runs/{live}"))["status"] in ("pending", "running"), "a live run is never pruned"
        metrics = http.get("/metrics").text
        assert 'awp_pruned_total{kind="runs"}' in metrics and "awp_retention_batches_total" in metrics
        line = next(x for x in metrics.splitlines() if x.startswith('awp_pruned_total{kind="runs"}'))
        assert float(line.split()[-1]) >= 1
    finally:
        sql(db_dsn, "SELECT awp.configure(retention_ms => 604800000)")
        finish_all(db_dsn)


def test_metrics_stay_bounded_with_20000_finished_runs(http, gw, db_dsn):
    def snapshot_ms() -> float:
        with psycopg.connect(db_dsn, autocommit=True) as c:
            times = []
            for _ in range(30):
                started = time.perf_counter()
                c.execute("SELECT awp.metrics_snapshot()").fetchone()
                times.append((time.perf_counter() - started) * 1000)
            return statistics.median(times)

    sql(db_dsn, "SELECT awp._compact_status_counts()")
    empty = snapshot_ms()
    wid = workflow(http)
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(
            "INSERT INTO awp.runs (run_id, workflow_id, workflow_version, status, concurrency, created_at, started_at,"
            " finished_at) SELECT 'run_bulk' || g, %s, 1, 'succeeded', 1, now(), now(), now()"
            " FROM generate_series(1, 20000) g",
            (wid,),
        )
        c.execute("SELECT awp._compact_status_counts()")
        c.execute("ANALYZE awp.runs")
    full = snapshot_ms()
    text = http.get("/metrics").text
    succeeded = next(x for x in text.splitlines() if x.startswith('awp_runs{status="succeeded"}'))
    assert float(succeeded.split()[-1]) >= 20000
    # One GROUP BY over 20,000 runs alone takes several ms; the bounded snapshot does not notice them.
    assert full < 3 * empty + 2.0, f"metrics_snapshot: {empty:.2f} ms empty, {full:.2f} ms with 20,000 finished runs"
    print(f"metrics_snapshot median: {empty:.2f} ms (no finished run), {full:.2f} ms (20,000 finished runs)")
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("DELETE FROM awp.runs WHERE run_id LIKE 'run_bulk%%'")
        c.execute("SELECT awp._compact_status_counts()")
