"""Live progress, logs and partial output, end to end (docs/progress.md; AWP issue 45): a python handler that logs
and emits 200 chunks while a client follows GET /runs/{id}/stream and sees them in order within 1 s each (the
latency is printed: run with -s); resuming with Last-Event-ID; the stream limit (503 + Retry-After); the worker
route's fencing and bad input (409, 413, 400, 404); `awp run logs --follow` and `awp run show`; a worker fenced off
mid-stream (frozen until its lease was reaped) writes nothing more."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
from click.testing import CliRunner
from worker_support import REPO, Workers, all_items, api, apply, start_run, task, wait_run

from awp.cli.main import main
from awp.protocol.limits import MAX_ENTRY_BYTES, MAX_PROGRESS_BYTES
from awp_testing.gateway import ServeProcess, wait_until

TEST_HANDLERS = "python/tests/handlers_for_tests.py"
PROTOCOL = {"X-Worker-Protocol-Version": "1"}
STREAM_LIMIT = 3


GATEWAY_SETTINGS = {"lease_duration_ms": 2000, "heartbeat_interval_ms": 300}
GATEWAY_OPTIONS = {"args": ["--stream-limit", str(STREAM_LIMIT)]}


def python_task(key: str, action: str, inp: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"key": key, "executor": "python", "action": action, "input": inp, "timeout_ms": 60000, **extra}


def new_run(gw: ServeProcess, wid: str, tasks: list[dict[str, Any]]) -> str:
    return start_run(gw, apply(gw, {"id": wid, "tasks": tasks}))


def only_run(gw: ServeProcess, wid: str, tasks: list[dict[str, Any]]) -> str:
    """A new run, every other run of the module's database canceled first: a test that claims by hand gets its
    own run's lease, not one left ready by an earlier test."""
    for run in all_items(gw, "/runs"):
        if run["status"] in ("pending", "running"):
            api(gw, "POST", f"/runs/{run['run_id']}/cancel", {})
    return new_run(gw, wid, tasks)


def sse_events(response: httpx.Response) -> Iterator[tuple[str, str, dict[str, Any], float]]:
    """(id, event, data, time received) of each message of an event stream."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            continue
        if line == "":
            if "event" in fields:
                yield fields.get("id", ""), fields["event"], json.loads(fields.get("data", "null")), time.time()
            fields = {}
            continue
        name, _, value = line.partition(": ")
        fields[name] = value


def stream(gw: ServeProcess, run_id: str, last_event_id: str | None = None) -> Any:
    headers = {**gw.auth("viewer"), **({"Last-Event-ID": last_event_id} if last_event_id else {})}
    return httpx.stream("GET", gw.api(f"/runs/{run_id}/stream"), headers=headers, timeout=httpx.Timeout(30.0))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def test_a_client_follows_200_chunks_in_order_within_a_second_each(gw: ServeProcess, workers: Workers) -> None:
    workers.start("stream-w", executors="python", extra=["--handlers", TEST_HANDLERS])
    run_id = new_run(gw, "progress-stream", [python_task("gen", "test-stream", {"chunks": 200, "interval_ms": 10})])
    opened = time.time()
    chunks: list[tuple[int, float, float]] = []  # (index, emitted at, received at)
    lines: list[str] = []
    progress: list[int] = []
    kinds: list[str] = []
    ids: list[str] = []
    with stream(gw, run_id) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for event_id, event, data, received in sse_events(r):
            kinds.append(event)
            ids.append(event_id)
            if event == "chunk":
                for part in filter(None, data["chunk"].split(";")):
                    index, _, emitted = part.partition("@")
                    chunks.append((int(index), float(emitted), received))
            elif event == "log":
                assert data["text"] == data["line"]
                lines.append(data["line"])
            elif event == "progress":
                progress.append(data["progress"]["done"])
            elif event == "end":
                assert data == {"run_id": run_id, "status": "succeeded"}
    assert kinds[-1] == "end", "the stream ends with the run's final state"
    assert "run" in kinds and "task" in kinds, "state changes are streamed too"
    assert [i for i, _, _ in chunks] == list(range(200)), "every chunk, in order"
    assert lines == [f"line {i}" for i in range(0, 200, 10)]
    assert progress == sorted(progress) and progress[-1] == 200, "progress only grows and ends at 200"
    sequences = [tuple(int(x) for x in i.split("-")) for i in ids]
    assert sequences == sorted(sequences), "event ids only grow"
    latencies = [received - max(emitted, opened) for _, emitted, received in chunks]
    slow = [(i, round(lat, 3)) for (i, _, _), lat in zip(chunks, latencies, strict=True) if lat > 0.5]
    assert max(latencies) < 1.0, f"a chunk took {max(latencies):.3f}s from ctx.emit to the client: {slow}"
    print(
        f"\nctx.emit -> SSE client latency over {len(latencies)} chunks:"
        f" p50 {percentile(latencies, 0.5) * 1000:.0f} ms,"
        f" p99 {percentile(latencies, 0.99) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms,"
        f" mean {statistics.mean(latencies) * 1000:.0f} ms"
    )

    # Resuming: after an event id, only what followed it (a progress value is kept once, at its latest write, so
    # the earlier ones are not replayed); the replay ends again with the final state.
    middle = len(ids) // 2
    with stream(gw, run_id, ids[middle]) as r:
        rest = [(i, e) for i, e, _, _ in sse_events(r)]
    assert rest and rest[-1][1] == "end"
    live = [(i, e) for i, e in zip(ids[middle + 1 :], kinds[middle + 1 :], strict=True) if e != "progress"]
    assert [x for x in rest if x[1] != "progress"] == live
    assert [e for _, e in rest].count("progress") == 1
    # The logs route has them too, in order.
    logs = httpx.get(gw.api(f"/runs/{run_id}/tasks/gen/logs"), headers=gw.auth("viewer")).json()
    assert [x["text"] for x in logs["items"] if x["kind"] == "log"] == lines
    assert logs["progress"] == {"done": 200, "of": 200} and logs["truncated"] is False
    assert task(gw, run_id, "gen")["progress"] == {"done": 200, "of": 200}


def test_stream_bad_input_and_the_stream_limit(gw: ServeProcess) -> None:
    unknown = httpx.get(gw.api("/runs/run_nope/stream"), headers=gw.auth("viewer"))
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "not_found")
    assert httpx.get(gw.api("/runs/run_nope/stream")).status_code == 401
    # A run that waits for a signal stays running without a worker.
    run_id = new_run(gw, "progress-wait", [{"key": "s", "executor": "signal", "input": {"timeout_ms": 600000}}])
    bad = httpx.get(gw.api(f"/runs/{run_id}/stream"), headers={**gw.auth("viewer"), "Last-Event-ID": "x"})
    assert bad.status_code == 400
    open_streams = [stream(gw, run_id) for _ in range(STREAM_LIMIT)]
    try:
        responses = [s.__enter__() for s in open_streams]
        assert all(r.status_code == 200 for r in responses)
        over = httpx.get(gw.api(f"/runs/{run_id}/stream"), headers=gw.auth("viewer"))
        assert over.status_code == 503 and over.headers.get("Retry-After"), over.text
        assert f"at most {STREAM_LIMIT}" in over.json()["error"]["message"]
    finally:
        for s in open_streams:
            s.__exit__(None, None, None)
    # A closed stream frees its place (the gateway notices at its next poll).
    wait_until(
        lambda: httpx.get(gw.api("/runs/run_nope/stream"), headers=gw.auth("viewer")).status_code == 404, 5, 0.1, "free"
    )
    httpx.post(gw.api(f"/runs/{run_id}/cancel"), headers=gw.auth("operator"), json={})


@contextlib.contextmanager
def kept_alive(gw: ServeProcess, worker_id: str, headers: dict[str, str], lease: dict[str, Any]) -> Iterator[None]:
    """Heartbeats of a worker driven by hand, every 150 ms (this module's worker must beat every 300 ms, and its
    lease lasts 2 s), for a test that may run slowly on a busy machine."""
    stop = threading.Event()
    ref = {"dispatch_id": lease["dispatch_id"], "lease_token": lease["lease_token"]}

    def beat() -> None:
        while not stop.wait(0.15):
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(gw.api(f"/workers/{worker_id}/heartbeat"), json={"leases": [ref]}, headers=headers)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        yield
    finally:
        stop.set()
        beater.join(5)


def register(gw: ServeProcess) -> tuple[str, dict[str, str]]:
    r = httpx.post(
        gw.api("/workers/register"),
        json={"display_name": "progress-http", "executor_kinds": ["mock"], "max_concurrency": 1},
        headers=gw.auth("bootstrap"),
    )
    assert r.status_code == 201, r.text
    return r.json()["worker_id"], {"Authorization": f"Bearer {r.json()['session_token']}", **PROTOCOL}


def test_the_progress_route_is_fenced_like_complete_and_refuses_bad_input(gw: ServeProcess) -> None:
    worker_id, headers = register(gw)
    run_id = only_run(gw, "progress-http", [{"key": "a", "executor": "mock"}])
    claim = httpx.post(gw.api(f"/workers/{worker_id}/claims"), json={"slots": 1, "wait_ms": 5000}, headers=headers)
    lease = claim.json()["leases"][0]
    url = gw.api(f"/workers/{worker_id}/leases/{lease['dispatch_id']}/progress")
    with kept_alive(gw, worker_id, headers, lease):
        check_the_progress_route(gw, worker_id, headers, run_id, lease, url)


def check_the_progress_route(
    gw: ServeProcess, worker_id: str, headers: dict[str, str], run_id: str, lease: dict[str, Any], url: str
) -> None:
    def post(body: Any, **kw: Any) -> httpx.Response:
        return httpx.post(url, json=body, headers=headers, **kw)

    ok = post({"lease_token": lease["lease_token"], "progress": {"pct": 50}, "logs": ["a", "b"], "chunks": ["c"]})
    assert ok.status_code == 200 and ok.json() == {"seq": 4, "truncated": False}, ok.text
    assert task(gw, run_id, "a")["progress"] == {"pct": 50}
    lost = post({"lease_token": "wrong", "logs": ["x"]})
    assert (lost.status_code, lost.json()["error"]["code"]) == (409, "lease_lost")
    big = post({"lease_token": lease["lease_token"], "progress": "x" * MAX_PROGRESS_BYTES})
    assert big.status_code == 413 and str(MAX_PROGRESS_BYTES) in big.json()["error"]["message"], big.text
    line = post({"lease_token": lease["lease_token"], "logs": ["y" * (MAX_ENTRY_BYTES + 1)]})
    assert line.status_code == 413 and str(MAX_ENTRY_BYTES) in line.json()["error"]["message"], line.text
    body = httpx.post(url, content=b"{not json", headers={**headers, "Content-Type": "application/json"})
    assert (body.status_code, body.json()["error"]["code"]) == (400, "invalid_request")
    assert post({"lease_token": lease["lease_token"]}).status_code == 400  # none of the three
    assert post({"lease_token": lease["lease_token"], "logs": [1]}).status_code == 400
    assert post({"lease_token": lease["lease_token"], "logs": ["x"], "extra": 1}).status_code == 400
    assert (
        httpx.post(
            url, json={"lease_token": "t", "logs": ["x"]}, headers={**headers, "Authorization": "Bearer x"}
        ).status_code
        == 401
    )
    logs = httpx.get(gw.api(f"/runs/{run_id}/tasks/a/logs"), headers=gw.auth("viewer")).json()
    assert [(x["kind"], x["text"]) for x in logs["items"]] == [("log", "a"), ("log", "b"), ("chunk", "c")]
    assert (logs["logs"], logs["chunks"]) == (["a", "b"], ["c"])
    after = httpx.get(gw.api(f"/runs/{run_id}/tasks/a/logs?after=2"), headers=gw.auth("viewer")).json()
    assert [x["text"] for x in after["items"]] == ["c"]
    assert httpx.get(gw.api(f"/runs/{run_id}/tasks/a/logs?after=x"), headers=gw.auth("viewer")).status_code == 400
    assert httpx.get(gw.api(f"/runs/{run_id}/tasks/nope/logs"), headers=gw.auth("viewer")).status_code == 404
    assert httpx.get(gw.api(f"/runs/{run_id}/tasks/a/logs")).status_code == 401
    # A write with its offset is applied once (a repeat after a lost answer writes nothing).
    once = {"lease_token": lease["lease_token"], "logs": ["d"], "offset": 3}
    assert post(once).json()["seq"] == 5
    assert post(once).json() == {"seq": None, "truncated": False}
    assert post({**once, "offset": -1}).status_code == 400
    # The last writes ride on the completion (live_output), written before the result.
    done = httpx.post(
        gw.api(f"/workers/{worker_id}/leases/{lease['dispatch_id']}/complete"),
        json={
            "lease_token": lease["lease_token"],
            "result": {"kind": "success"},
            "live_output": [{"logs": ["d", "final"], "offset": 3}],
        },
        headers=headers,
    )
    assert done.status_code == 200, done.text
    final = httpx.get(gw.api(f"/runs/{run_id}/tasks/a/logs"), headers=gw.auth("viewer")).json()
    assert [x["text"] for x in final["items"]] == ["a", "b", "c", "d", "final"]
    late = post({"lease_token": lease["lease_token"], "logs": ["late"]})
    assert (late.status_code, late.json()["error"]["code"]) == (409, "lease_lost"), "a completed lease writes nothing"
    logs = httpx.get(gw.api(f"/runs/{run_id}/tasks/a/logs"), headers=gw.auth("viewer")).json()
    assert "late" not in [x["text"] for x in logs["items"]]


def test_live_output_rides_in_the_completion_with_claim_and_in_batches(gw: ServeProcess) -> None:
    # With claim on complete the last output is written in the completion's own transaction (awp.complete_and_claim,
    # or grouped awp.complete_and_claim_many: db/tests/46_live_output.sql), on the batch route by a call before it.
    worker_id, headers = register(gw)
    run_id = only_run(gw, "progress-ride", [{"key": k, "executor": "mock"} for k in ("a", "b", "c", "d")])
    claim = httpx.post(gw.api(f"/workers/{worker_id}/claims"), json={"slots": 1, "wait_ms": 5000}, headers=headers)
    first = claim.json()["leases"][0]
    done = httpx.post(
        gw.api(f"/workers/{worker_id}/leases/{first['dispatch_id']}/complete"),
        json={
            "lease_token": first["lease_token"],
            "result": {"kind": "success"},
            "claim_slots": 1,
            "live_output": [{"logs": ["one"], "progress": {"pct": 100}}, {"chunks": ["tok"]}],
        },
        headers=headers,
    )
    assert done.status_code == 200, done.text
    second = done.json()["leases"][0]
    logs = httpx.get(gw.api(f"/runs/{run_id}/tasks/{first['task_key']}/logs"), headers=gw.auth("viewer")).json()
    assert (logs["task_status"], logs["logs"], logs["chunks"], logs["progress"]) == (
        "succeeded",
        ["one"],
        ["tok"],
        {"pct": 100},
    ), logs
    # A wrong lease token with output: lease_lost, and its output is not written.
    lost = httpx.post(
        gw.api(f"/workers/{worker_id}/leases/{second['dispatch_id']}/complete"),
        json={
            "lease_token": "wrong",
            "result": {"kind": "success"},
            "claim_slots": 1,
            "live_output": [{"logs": ["x"]}],
        },
        headers=headers,
    )
    assert (lost.status_code, lost.json()["error"]["code"]) == (409, "lease_lost"), lost.text
    bad = httpx.post(
        gw.api(f"/workers/{worker_id}/leases/{second['dispatch_id']}/complete"),
        json={"lease_token": second["lease_token"], "result": {"kind": "success"}, "claim_slots": 1, "live_output": {}},
        headers=headers,
    )
    assert bad.status_code == 400, bad.text
    # The batch route: one result with output, one refused.
    batch = httpx.post(
        gw.api(f"/workers/{worker_id}/completions"),
        json={
            "results": [
                {
                    "dispatch_id": second["dispatch_id"],
                    "lease_token": second["lease_token"],
                    "result": {"kind": "success"},
                    "live_output": [{"logs": ["two", "three"]}],
                },
                {
                    "dispatch_id": "dsp_nope",
                    "lease_token": "t",
                    "result": {"kind": "success"},
                    "live_output": [{"logs": ["never"]}],
                },
            ],
            "claim_slots": 0,
        },
        headers=headers,
    )
    assert batch.status_code == 200, batch.text
    assert [("error" in r) for r in batch.json()["results"]] == [False, True], batch.text
    logs = httpx.get(gw.api(f"/runs/{run_id}/tasks/{second['task_key']}/logs"), headers=gw.auth("viewer")).json()
    assert (logs["task_status"], logs["logs"]) == ("succeeded", ["two", "three"]), logs


def cli_env(gw: ServeProcess) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWP_")},
        "AWP_GATEWAY_URL": gw.base_url,
        "AWP_OPERATOR_TOKEN": gw.tokens.operator,
        "PYTHONPATH": str(REPO / "python"),
    }


def test_awp_run_logs_follow_prints_lines_as_they_come(gw: ServeProcess, workers: Workers) -> None:
    workers.start("follow-w", executors="python", extra=["--handlers", TEST_HANDLERS])
    run_id = new_run(
        gw, "progress-follow", [python_task("ticker", "test-log-forever", {"seconds": 3, "interval_ms": 100})]
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "awp", "run", "logs", run_id, "ticker", "--follow"],
        env=cli_env(gw),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        first_at = time.monotonic()
        assert first == "tick 0\n", first + (proc.stderr.read() if proc.stderr else "")
        run = get_status(gw, run_id)
        assert run == "running", "the first line came while the task still ran"
        out = proc.stdout.read()  # the same buffered reader as readline (communicate would skip what it holds)
        ended_at = time.monotonic()
        assert proc.wait(20) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.kill()
    lines = [first.rstrip("\n"), *out.splitlines()]
    assert lines == [f"tick {i}" for i in range(len(lines))] and len(lines) >= 20, lines
    assert ended_at - first_at > 1.5, "--follow printed lines over the task's life, and ended with it"
    assert wait_run(gw, run_id)["status"] == "succeeded"
    # Without --follow: what is there now, then exit; --json: one object per line.
    res = CliRunner().invoke(
        main, ["run", "logs", run_id, "ticker", "--json", "--gateway", gw.base_url, "--token", gw.tokens.operator]
    )
    assert res.exit_code == 0, res.output
    assert [json.loads(x)["text"] for x in res.output.splitlines()] == lines


def get_status(gw: ServeProcess, run_id: str) -> str:
    return str(httpx.get(gw.api(f"/runs/{run_id}"), headers=gw.auth("viewer")).json()["status"])


def test_awp_run_show_prints_the_latest_progress(gw: ServeProcess, workers: Workers) -> None:
    workers.start("show-w", executors="python", extra=["--handlers", TEST_HANDLERS])
    run_id = new_run(gw, "progress-show", [python_task("gen", "test-stream", {"chunks": 100, "interval_ms": 40})])
    wait_until(lambda: (task(gw, run_id, "gen").get("progress") or {}).get("done", 0) > 5, 15, 0.05, "progress")
    res = CliRunner().invoke(main, ["run", "show", run_id, "--gateway", gw.base_url, "--token", gw.tokens.operator])
    assert res.exit_code == 0, res.output
    assert "progress gen: " in res.output and '"of": 100' in res.output.replace('"of":100', '"of": 100'), res.output
    res = CliRunner().invoke(
        main, ["run", "show", run_id, "--json", "--gateway", gw.base_url, "--token", gw.tokens.operator]
    )
    assert json.loads(res.output)["progress"]["gen"]["of"] == 100
    wait_run(gw, run_id)


def output_rows(db_dsn: str, run_id: str, attempt: int) -> int:
    with psycopg.connect(db_dsn) as c:
        row = c.execute(
            "SELECT coalesce(sum(cardinality(entries)), 0) FROM awp.task_output WHERE run_id = %s AND attempt = %s",
            (run_id, attempt),
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_worker_fenced_off_mid_stream_writes_nothing_more(gw: ServeProcess, workers: Workers, db_dsn: str) -> None:
    frozen = workers.start("fenced-w", executors="python", extra=["--handlers", TEST_HANDLERS])
    run_id = new_run(
        gw,
        "progress-fenced",
        [
            python_task(
                "ticker",
                "test-log-forever",
                {"seconds": 8, "interval_ms": 50},
                retry={"max_attempts": 2, "interval_ms": 0},
            )
        ],
    )
    wait_until(lambda: output_rows(db_dsn, run_id, 1) >= 5, 15, 0.05, "attempt 1 logs")
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    try:
        # Its lease expires (2 s) and the reaper ends attempt 1; another worker runs attempt 2.
        wait_until(
            lambda: task(gw, run_id, "ticker")["attempt_history"][0]["status"] != "running", 15, 0.1, "attempt 1 reaped"
        )
        kept = output_rows(db_dsn, run_id, 1)
        workers.start("fenced-w2", executors="python", extra=["--handlers", TEST_HANDLERS])
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    # The thawed worker's handler keeps logging; its sends are refused (lease_lost) or dropped with the lease.
    wait_until(lambda: output_rows(db_dsn, run_id, 2) >= 5, 20, 0.1, "attempt 2 logs")
    time.sleep(1.5)
    assert output_rows(db_dsn, run_id, 1) == kept, "the fenced-off worker wrote more lines"
    assert wait_run(gw, run_id, 30)["status"] == "succeeded"
    assert output_rows(db_dsn, run_id, 1) == kept
    assert "lease_lost" in frozen.log() or "revoked" in frozen.log() or "not completing" in frozen.log()


def test_a_client_that_does_not_read_holds_no_database_connection(gw: ServeProcess) -> None:
    """Streams whose clients stop reading (their socket buffers full) wait on the socket, not on the database: the
    request pool stays free (/health/ready) and the API answers at once."""
    import socket

    worker_id, headers = register(gw)
    run_id = only_run(gw, "progress-slow", [{"key": "a", "executor": "mock"}])
    claim = httpx.post(gw.api(f"/workers/{worker_id}/claims"), json={"slots": 1, "wait_ms": 5000}, headers=headers)
    lease = claim.json()["leases"][0]
    url = gw.api(f"/workers/{worker_id}/leases/{lease['dispatch_id']}/progress")
    line = "x" * 1000

    with kept_alive(gw, worker_id, headers, lease):
        for _ in range(6):  # 2,400 lines of 1 KB: far more than the sockets hold
            r = httpx.post(url, json={"lease_token": lease["lease_token"], "logs": [line] * 400}, headers=headers)
            assert r.status_code == 200, r.text
        socks = []
        try:
            for _ in range(STREAM_LIMIT):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect(("127.0.0.1", gw.port))
                s.sendall(
                    f"GET /api/v1/runs/{run_id}/stream HTTP/1.1\r\nHost: x\r\n"
                    f"Authorization: Bearer {gw.tokens.viewer}\r\n\r\n".encode()
                )
                socks.append(s)
            for s in socks:  # each stream started (its head and first events came)
                s.settimeout(5)
                assert s.recv(1024).startswith(b"HTTP/1.1 200"), "the stream did not start"
            time.sleep(1.0)  # the streams have written what the sockets take and wait to write more
            started = time.monotonic()
            run = httpx.get(gw.api(f"/runs/{run_id}"), headers=gw.auth("viewer"), timeout=5)
            assert run.status_code == 200 and time.monotonic() - started < 2
            # No stream holds a request connection (a request just answered may take a moment to give its back).
            wait_until(
                lambda: httpx.get(gw.url("/health/ready")).json()["pools"]["requests"]["in_use"] == 0,
                3,
                0.1,
                "the request pool idle while the streams wait on their sockets",
            )
            over = httpx.get(gw.api(f"/runs/{run_id}/stream"), headers=gw.auth("viewer"))
            assert over.status_code == 503, "the slow streams are still open (and counted)"
            assert httpx.get(gw.api(f"/runs/{run_id}"), headers=gw.auth("viewer")).json()["status"] == "running"
        finally:
            for s in socks:
                s.close()


def test_batches_over_the_same_runs_take_their_locks_in_run_order(db_dsn: str) -> None:
    """awp.report_progress_many writes its items in run_id order: a batch that holds run 1's counter row while a
    second batch (given run 2's lease first) waits for it can still write run 2 (no lock cycle, no deadlock)."""
    from psycopg.types.json import Jsonb

    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(
            "SELECT * FROM awp.create_workflow_version(%s)",
            (json.dumps({"id": "progress-order", "tasks": [{"key": "a", "executor": "mock"}]}),),
        )
        runs = sorted(str(c.execute("SELECT awp.start_run('progress-order')").fetchone()[0]) for _ in range(2))  # type: ignore[index]
        row = c.execute("SELECT worker_id, session_token FROM awp.register_worker('order', '{mock}', 10)").fetchone()
        assert row is not None
        worker, token = row
        c.execute("SELECT awp.coordinator_tick()")
        leases = {
            r[0]: {"dispatch_id": r[1], "lease_token": r[2]}
            for r in c.execute(
                "SELECT run_id, dispatch_id, lease_token FROM awp.claim_tasks(%s, %s, 10)", (worker, token)
            )
        }
    first, second = (leases[r] for r in runs)
    sql = "SELECT dispatch_id, error FROM awp.report_progress_many(%s, %s, %s)"
    with psycopg.connect(db_dsn) as t1, psycopg.connect(db_dsn) as t2:
        t1.execute("SET lock_timeout = '10s'")
        t2.execute("SET lock_timeout = '10s'")
        t1.execute(sql, (worker, token, Jsonb([{**first, "logs": ["t1 on run 1"]}]))).fetchall()  # holds run 1's row
        done: list[Any] = []

        def other() -> None:  # run 2's lease first: written after run 1's, which waits for t1
            rows = t2.execute(
                sql, (worker, token, Jsonb([{**second, "logs": ["t2 on run 2"]}, {**first, "logs": ["t2 on run 1"]}]))
            ).fetchall()
            t2.commit()
            done.append(rows)

        waiter = threading.Thread(target=other)
        waiter.start()
        time.sleep(0.5)
        assert not done, "the second batch waits for run 1's row"
        t1.execute(sql, (worker, token, Jsonb([{**second, "logs": ["t1 on run 2"]}]))).fetchall()  # no deadlock
        t1.commit()
        waiter.join(15)
        assert done and [r[1] for r in done[0]] == [None, None], done
