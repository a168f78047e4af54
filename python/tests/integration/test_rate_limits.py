"""Rate limits, concurrency keys and priority end to end (docs/limits.md): the /limits routes and their errors, the
``awp limit`` commands, a run of real workers behind ``max_in_flight`` (sampled: never over, and used up), its held
tasks' wait reason and the per-limit metrics, and a run started with a priority over HTTP and the CLI. The rules
themselves, edge by edge, are pgTAP's (db/tests/43_rate_limits.sql); the race of eight claimers is in
test_protocol_races.py."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import psycopg
from click.testing import CliRunner, Result
from worker_support import Workers, apply, mock_task, tasks, wait_run

from awp.cli.main import main
from awp_testing.gateway import ServeProcess, wait_until


def limits_api(
    gw: ServeProcess, method: str, name: str = "", body: Any = None, role: str = "operator"
) -> httpx.Response:
    path = "/limits" + (f"/{name}" if name else "")
    return httpx.request(method, gw.api(path), json=body, headers=gw.auth(role), timeout=10)


def awp(gw: ServeProcess, *args: str) -> Result:
    env = {"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": gw.tokens.operator}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def error_code(r: httpx.Response) -> str:
    return str(r.json()["error"]["code"])


def test_the_limits_routes_define_list_read_and_delete_limits(gw: ServeProcess) -> None:
    put = limits_api(gw, "PUT", "http-a", {"max_in_flight": 3, "per_window": 10, "window_ms": 1000})
    assert put.status_code == 200, put.text
    assert {k: put.json()[k] for k in ("name", "max_in_flight", "per_window", "window_ms", "in_flight", "held")} == {
        "name": "http-a",
        "max_in_flight": 3,
        "per_window": 10,
        "window_ms": 1000,
        "in_flight": 0,
        "held": 0,
    }
    assert limits_api(gw, "PUT", "http-a", {"max_in_flight": 4}).json()["per_window"] is None, "PUT replaces"
    assert limits_api(gw, "GET", "http-a").json()["max_in_flight"] == 4
    assert "http-a" in [x["name"] for x in limits_api(gw, "GET").json()["items"]]
    for body, says in (
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"max_in_flight": -1}, "max_in_flight"),
        ({"per_window": 5}, "per_window and window_ms go together"),
        ({}, "a limit needs max_in_flight"),
        ({"max_in_flight": "2"}, "max_in_flight"),
        ({"max_inflight": 2}, "max_inflight"),
    ):
        bad = limits_api(gw, "PUT", "http-b", body)
        assert bad.status_code == 400 and error_code(bad) == "invalid_request", (body, bad.text)
        assert says in bad.json()["error"]["message"], (body, bad.text)
    bad_name = limits_api(gw, "PUT", "no%20spaces", {"max_in_flight": 1})
    assert bad_name.status_code == 400 and "limit name" in bad_name.json()["error"]["message"], bad_name.text
    assert limits_api(gw, "GET", "http-b").status_code == 404, "nothing was stored by the refused PUTs"
    assert limits_api(gw, "PUT", "http-b", {"max_in_flight": 1}, role="viewer").status_code == 403
    assert limits_api(gw, "GET", "http-a", role="viewer").status_code == 200, "a viewer reads limits"
    assert limits_api(gw, "DELETE", "http-a").json() == {"name": "http-a", "deleted": True}
    again = limits_api(gw, "DELETE", "http-a")
    assert again.status_code == 404 and error_code(again) == "not_found"


def test_the_limit_commands(gw: ServeProcess) -> None:
    made = awp(gw, "limit", "set", "cli-openai", "--max-in-flight", "50", "--per-window", "100", "--window-ms", "60000")
    assert made.exit_code == 0, made.output
    assert made.output.strip() == "limit cli-openai: at most 50 in flight, 100 starts per 60000 ms"
    listed = awp(gw, "limit", "list")
    assert any(line.split()[0] == "cli-openai" for line in listed.output.splitlines()[1:]), listed.output
    assert json.loads(awp(gw, "limit", "list", "--json").output)[0]["name"] == "cli-openai"
    usage = awp(gw, "limit", "set", "cli-x", "--per-window", "5")
    assert usage.exit_code == 2 and "--per-window and --window-ms go together" in usage.output
    assert awp(gw, "limit", "delete", "cli-openai").output.strip() == "limit cli-openai deleted"
    gone = awp(gw, "limit", "delete", "cli-openai")
    assert gone.exit_code != 0 and "not_found" in gone.output


def metric(gw: ServeProcess, name: str, limit: str) -> float | None:
    for line in httpx.get(gw.url("/metrics"), timeout=10).text.splitlines():
        if line.startswith(f'{name}{{limit="{limit}"}}'):
            return float(line.split()[-1])
    return None


def test_a_run_behind_max_in_flight_never_has_more_in_flight(gw: ServeProcess, workers: Workers, db_dsn: str) -> None:
    assert limits_api(gw, "PUT", "e2e-api", {"max_in_flight": 3}).status_code == 200
    definition = {
        "id": "rate-limited",
        "concurrency": 20,
        "tasks": [{**mock_task(f"t{i}", sleep_ms=250), "limits": ["e2e-api"]} for i in range(12)],
    }
    workers.start("rl-w1", executors="mock", concurrency=8)
    wf = apply(gw, definition)
    stop = threading.Event()
    seen: list[int] = []

    def sample() -> None:
        with psycopg.connect(db_dsn, autocommit=True) as c:
            while not stop.is_set():
                row = c.execute(
                    "SELECT count(*) FROM awp.tasks WHERE status IN ('queued', 'running')"
                    " AND limit_buckets @> ARRAY['e2e-api']"
                ).fetchone()
                assert row is not None
                seen.append(int(row[0]))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        run = httpx.post(
            gw.api(f"/workflows/{wf[0]}/versions/{wf[1]}/runs"),
            json={},
            headers={**gw.auth("operator"), "Idempotency-Key": "rl-e2e-1"},
            timeout=10,
        ).json()["run_id"]
        held = wait_until(
            lambda: [t for t in tasks(gw, run).values() if t["wait_reason"] == "rate_limited"], 15, 0.05, "a held task"
        )
        assert held[0]["wait_detail"].startswith("limit e2e-api: 3 of max_in_flight 3 in flight"), held[0]
        assert held[0]["limits"] == ["e2e-api"]
        shown = awp(gw, "run", "task", run, held[0]["task_key"])
        assert "limits e2e-api" in shown.output and "waiting: rate_limited: limit e2e-api" in shown.output, shown.output
        assert metric(gw, "awp_rate_limit_in_flight", "e2e-api") is not None
        assert wait_run(gw, run, 60)["status"] == "succeeded"
    finally:
        stop.set()
        sampler.join(10)
    assert seen and max(seen) == 3, f"in flight sampled: max {max(seen or [0])} of {len(seen)} samples"
    assert metric(gw, "awp_rate_limit_in_flight", "e2e-api") == 0
    assert metric(gw, "awp_rate_limit_held_tasks", "e2e-api") == 0


def test_a_run_started_with_a_priority(gw: ServeProcess) -> None:
    wf = apply(
        gw,
        {
            "id": "prio-http",
            "tasks": [{"key": "a", "executor": "mock", "priority": 2}, {"key": "b", "executor": "mock"}],
        },
    )
    url = gw.api(f"/workflows/{wf[0]}/versions/{wf[1]}/runs")
    plain = httpx.post(url, json={}, headers={**gw.auth("operator"), "Idempotency-Key": "p-1"}, timeout=10).json()
    assert {k: t["priority"] for k, t in tasks(gw, plain["run_id"]).items()} == {"a": 2, "b": 5}
    urgent = httpx.post(
        url, json={"priority": 9}, headers={**gw.auth("operator"), "Idempotency-Key": "p-2"}, timeout=10
    )
    assert urgent.status_code == 202, urgent.text
    assert {k: t["priority"] for k, t in tasks(gw, urgent.json()["run_id"]).items()} == {"a": 9, "b": 9}
    replay = httpx.post(
        url, json={"priority": 8}, headers={**gw.auth("operator"), "Idempotency-Key": "p-2"}, timeout=10
    )
    assert replay.status_code == 409, "the same key with another priority is another request"
    bad = httpx.post(url, json={"priority": 10}, headers={**gw.auth("operator"), "Idempotency-Key": "p-3"}, timeout=10)
    assert bad.status_code == 400 and "priority must be an integer from 0 to 9" in bad.text
    batch = httpx.post(
        url + "/batch",
        json={"runs": [{"idempotency_key": "pb-1", "priority": 7}, {"idempotency_key": "pb-2"}]},
        headers=gw.auth("operator"),
        timeout=10,
    )
    assert batch.status_code == 202, batch.text
    first, second = (r["run_id"] for r in batch.json()["runs"])
    assert tasks(gw, first)["b"]["priority"] == 7 and tasks(gw, second)["b"]["priority"] == 5
    started = awp(gw, "run", "start", "prio-http", "--priority", "6", "--json")
    assert started.exit_code == 0, started.output
    assert tasks(gw, json.loads(started.output)["run_id"])["a"]["priority"] == 6
    assert awp(gw, "run", "start", "prio-http", "--priority", "11").exit_code == 2
