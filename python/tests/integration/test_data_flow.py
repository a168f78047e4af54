"""Data flow through a run, end to end over HTTP with real worker processes (docs/data-flow.md): a run's
input, every dependency's output in the lease (`run_input`, `upstream`), the run's output, idempotency with
input, and a ready task that no worker can take."""

from __future__ import annotations

import time

import httpx
import pytest
from click.testing import CliRunner, Result
from worker_support import SHORT_LEASES, Workers, api, apply, get_run, mock_task, task, wait_run

from awp.cli.main import main
from awp_testing.gateway import PROTOCOL, ServeProcess, bearer, wait_until

GATEWAY_SETTINGS = SHORT_LEASES
GATEWAY_OPTIONS = {"coordinator_interval_ms": 200}


def cli(gw: ServeProcess, *args: str) -> Result:
    env = {"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": gw.tokens.operator, "COLUMNS": "200"}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def start(gw: ServeProcess, workflow: tuple[str, int], body: object, key: str | None = None) -> httpx.Response:
    wf, version = workflow
    headers = {**gw.auth("operator"), "Idempotency-Key": key or f"df-{time.monotonic_ns()}"}
    return httpx.post(gw.api(f"/workflows/{wf}/versions/{version}/runs"), json=body, headers=headers, timeout=10)


def test_outputs_flow_along_the_graph_and_become_the_run_output(gw: ServeProcess, workers: Workers) -> None:
    workers.start("df-mock", concurrency=3)
    definition = {
        "id": "df-pipeline",
        "tasks": [
            mock_task("fetch-1", output={"doc": "one"}),
            mock_task("fetch-2", output={"doc": "two"}),
            mock_task("silent"),  # the default mock output
            mock_task("summarise", ["fetch-1", "fetch-2"], echo=True),
            mock_task("review", ["summarise", "silent"], echo=True, output="approved"),
        ],
    }
    r = start(gw, apply(gw, definition), {"input": {"topic": "postgres", "depth": 2}})
    assert r.status_code == 202, r.text
    run_id = r.json()["run_id"]
    run = wait_run(gw, run_id)
    assert run["status"] == "succeeded"
    assert run["input"] == {"topic": "postgres", "depth": 2}

    summarise = task(gw, run_id, "summarise")["attempt_history"][-1]["output"]
    assert summarise == {
        "task": "summarise",
        "run_input": {"topic": "postgres", "depth": 2},
        "upstream": {"fetch-1": {"doc": "one"}, "fetch-2": {"doc": "two"}},
    }
    review = task(gw, run_id, "review")["attempt_history"][-1]["output"]
    assert review["upstream"] == {
        "summarise": summarise,
        "silent": {"task": "silent", "action": "silent", "attempt": 1},
    }
    # Only the task with no dependants makes the run's output.
    assert run["output"] == {"review": review}
    shown = cli(gw, "run", "show", run_id)
    assert shown.exit_code == 0, shown.output
    assert 'input  {"depth":2,"topic":"postgres"}' in shown.output  # jsonb's key order
    assert 'output {"review":{' in shown.output and "waiting for a worker" not in shown.output
    assert run["waiting_for_executors"] == []
    assert run["schedule_id"] is None


def test_python_handlers_see_run_input_and_upstream(gw: ServeProcess, workers: Workers) -> None:
    workers.start("df-py", executors="python", extra=["--handlers", "examples/handlers.py"], concurrency=2)
    definition = {
        "id": "df-words",
        "tasks": [
            {"key": "a", "executor": "python", "action": "word-count", "input": {"text": "one two three"}},
            {"key": "b", "executor": "python", "action": "word-count", "input": {"text": "four five"}},
            {"key": "total", "executor": "python", "action": "merge-counts", "depends_on": ["a", "b"]},
        ],
    }
    run_id = start(gw, apply(gw, definition), {"input": {"label": "batch-7"}}).json()["run_id"]
    run = wait_run(gw, run_id)
    assert run["status"] == "succeeded", task(gw, run_id, "total")
    assert run["output"] == {"total": {"label": "batch-7", "by_task": {"a": 3, "b": 2}, "total": 5}}


def test_no_input_empty_body_and_empty_object_all_start_a_run_with_input_object(gw: ServeProcess) -> None:
    wf = apply(gw, {"id": "df-bodies", "tasks": [mock_task("a")]})
    headers = {**gw.auth("operator"), "Idempotency-Key": "df-empty-body"}
    url = gw.api(f"/workflows/{wf[0]}/versions/{wf[1]}/runs")
    no_body = httpx.post(url, headers=headers, timeout=10)
    assert no_body.status_code == 202, no_body.text
    # The same key with {} and with {"input": {}} is the same request: the same run.
    body: object
    for body in ({}, {"input": {}}, {"input": None}):
        again = start(gw, wf, body, key="df-empty-body")
        assert again.status_code == 202 and again.json()["run_id"] == no_body.json()["run_id"], body
    assert get_run(gw, no_body.json()["run_id"])["input"] == {}


def test_idempotency_key_with_another_input_is_a_conflict(gw: ServeProcess) -> None:
    wf = apply(gw, {"id": "df-idem", "tasks": [mock_task("a")]})
    first = start(gw, wf, {"input": {"n": 1}}, key="df-idem-key")
    assert first.status_code == 202
    replay = start(gw, wf, {"input": {"n": 1}}, key="df-idem-key")
    assert replay.status_code == 202 and replay.json()["run_id"] == first.json()["run_id"]
    other = start(gw, wf, {"input": {"n": 2}}, key="df-idem-key")
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_conflict"
    runs = api(gw, "GET", "/runs?workflow_id=df-idem")["items"]
    assert [r["run_id"] for r in runs] == [first.json()["run_id"]], "nothing was started by the conflict"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"input": [1, 2]}, "input must be a JSON object"),
        ({"input": "text"}, "input must be a JSON object"),
        ({"input": {"big": "x" * 70000}}, "65536"),
        ({"inputs": {}}, "inputs"),
    ],
)
def test_bad_run_input_is_400(gw: ServeProcess, body: object, fragment: str) -> None:
    wf = apply(gw, {"id": "df-bad", "tasks": [mock_task("a")]})
    r = start(gw, wf, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and fragment in error["message"]


def test_a_lease_carries_run_input_and_upstream_over_http(gw: ServeProcess) -> None:
    """A worker speaking the protocol by hand: the lease object has run_input and upstream."""
    r = httpx.post(
        gw.api("/workers/register"), json={"executor_kinds": ["mock"]}, headers=gw.auth("bootstrap"), timeout=10
    )
    assert r.status_code == 201, r.text
    reg = r.json()
    headers = {**bearer(reg["session_token"]), **PROTOCOL}
    wid = reg["worker_id"]
    definition = {
        "id": "df-by-hand",
        "tasks": [{"key": "root", "executor": "mock"}, {"key": "leaf", "executor": "mock", "depends_on": ["root"]}],
    }
    run_id = start(gw, apply(gw, definition), {"input": {"q": "why"}}).json()["run_id"]

    def claim() -> list[dict]:
        """The next lease of this run; leases of runs other tests left waiting are completed on the way."""
        r = httpx.post(
            gw.api(f"/workers/{wid}/claims"), json={"slots": 1, "wait_ms": 2000}, headers=headers, timeout=10
        )
        assert r.status_code == 200, r.text
        leases = r.json()["leases"]
        for other in [x for x in leases if x["run_id"] != run_id]:
            body = {"lease_token": other["lease_token"], "result": {"kind": "success"}}
            httpx.post(gw.api(f"/workers/{wid}/leases/{other['dispatch_id']}/complete"), json=body, headers=headers)
        return [x for x in leases if x["run_id"] == run_id]

    root = wait_until(claim, 10, 0.05, "the root lease")[0]
    assert (root["task_key"], root["run_input"], root["upstream"]) == ("root", {"q": "why"}, {})
    done = httpx.post(
        gw.api(f"/workers/{wid}/leases/{root['dispatch_id']}/complete"),
        json={
            "lease_token": root["lease_token"],
            "result": {"kind": "success", "output": {"because": 42}},
            "claim_slots": 1,
        },
        headers=headers,
        timeout=10,
    )
    assert done.status_code == 200, done.text
    leases = done.json()["leases"] or wait_until(claim, 10, 0.05, "the leaf lease")
    leaf = leases[0]
    assert (leaf["task_key"], leaf["run_input"], leaf["upstream"]) == ("leaf", {"q": "why"}, {"root": {"because": 42}})
    r = httpx.post(
        gw.api(f"/workers/{wid}/leases/{leaf['dispatch_id']}/complete"),
        json={"lease_token": leaf["lease_token"], "result": {"kind": "success"}},
        headers=headers,
        timeout=10,
    )
    assert r.status_code == 200
    assert wait_run(gw, run_id)["output"] == {"leaf": None}
    httpx.post(gw.api(f"/workers/{wid}/drain"), headers=headers, timeout=10)


def test_a_task_no_worker_can_take_says_so(gw: ServeProcess, workers: Workers) -> None:
    # Only mock workers ever ran in this module (and the fixture drained them): nobody offers python now.
    workers.start("df-mock-only", executors="mock")
    wf = apply(gw, {"id": "df-nobody", "tasks": [{"key": "p", "executor": "python", "action": "word-count"}]})
    run_id = start(gw, wf, {}).json()["run_id"]
    run = wait_until(
        lambda: (r := get_run(gw, run_id))["waiting_for_executors"] and r, 10, 0.1, "the run to say what it waits for"
    )
    assert run["waiting_for_executors"] == ["python"] and run["status"] == "pending"
    shown = cli(gw, "run", "show", run_id)
    assert shown.exit_code == 0 and "waiting for a worker with executor python" in shown.output, shown.output
    metrics = httpx.get(gw.url("/metrics"), headers=gw.auth("operator"), timeout=10).text
    assert 'awp_ready_tasks_without_worker{executor_kind="python"} 1.0' in metrics
    watched = cli(gw, "run", "start", "df-nobody", "--wait", "--timeout", "1", "--idempotency-key", "df-watch")
    assert watched.exit_code == 124 and "waiting for a worker with executor python" in watched.output, watched.output
    second = api(gw, "GET", "/runs?workflow_id=df-nobody")["items"][0]["run_id"]
    for rid in (run_id, second):
        api(gw, "POST", f"/runs/{rid}/cancel", {})
        wait_run(gw, rid)
    metrics = httpx.get(gw.url("/metrics"), headers=gw.auth("operator"), timeout=10).text
    assert 'awp_ready_tasks_without_worker{executor_kind="python"}' not in metrics
