"""The HTTP API of ``awp serve`` (python/awp/openapi.yaml) against a real process and a real PostgreSQL:
every route's success and documented errors, the auth matrix, body limits, idempotency keys,
long-poll claims, metrics, and the OpenAPI contract (routes and status enums)."""

from __future__ import annotations

import re
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from raw_http import exchange

from awp.dev.procs import awp_command
from awp.server.app import create_app
from awp.server.appstate import DB, GatewayConfig
from awp_testing.cluster import one
from awp_testing.gateway import PROTOCOL, ServeProcess, Tokens, bearer, serve, wait_until

API = "/api/v1"


GATEWAY_SETTINGS = {"lease_duration_ms": 10000, "heartbeat_interval_ms": 2000}


@pytest.fixture(scope="module")
def http(gw: ServeProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gw.base_url, timeout=40) as client:
        yield client


pytestmark = pytest.mark.usefixtures("no_live_runs")  # conftest.py


def error_code(r: httpx.Response) -> str:
    body = r.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "request_id"}, body
    assert body["error"]["request_id"] == r.headers["X-Request-Id"]
    return body["error"]["code"]


def definition(wid: str | None = None, tasks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "id": wid or "wf-" + secrets.token_hex(4),
        "tasks": tasks or [{"key": "a", "executor": "mock"}, {"key": "b", "executor": "mock", "depends_on": ["a"]}],
    }


def apply(http: httpx.Client, gw: ServeProcess, body: Any, key: str | None = None) -> httpx.Response:
    headers = {**gw.auth("operator"), "Idempotency-Key": key or secrets.token_hex(8)}
    return http.post(f"{API}/workflows", json=body, headers=headers)


def start(http: httpx.Client, gw: ServeProcess, wid: str, version: int = 1, key: str | None = None) -> httpx.Response:
    headers = {**gw.auth("operator"), "Idempotency-Key": key or secrets.token_hex(8)}
    return http.post(f"{API}/workflows/{wid}/versions/{version}/runs", headers=headers)


def new_run(http: httpx.Client, gw: ServeProcess, tasks: list[dict[str, Any]] | None = None) -> tuple[str, str]:
    body = definition(tasks=tasks)
    assert apply(http, gw, body).status_code == 201
    r = start(http, gw, body["id"])
    assert r.status_code == 202, r.text
    return body["id"], r.json()["run_id"]


class Worker:
    def __init__(self, http: httpx.Client, gw: ServeProcess, max_concurrency: int = 4) -> None:
        r = http.post(
            f"{API}/workers/register",
            json={"display_name": "test", "executor_kinds": ["mock"], "max_concurrency": max_concurrency},
            headers=gw.auth("bootstrap"),
        )
        assert r.status_code == 201, r.text
        self.http, self.info = http, r.json()
        self.id, self.token = self.info["worker_id"], self.info["session_token"]
        self.headers = {**bearer(self.token), **PROTOCOL}

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.http.post(f"{API}/workers/{self.id}{path}", json=body, headers=headers or self.headers)

    def claim(self, slots: int = 1, wait_ms: int = 0) -> httpx.Response:
        return self.post("/claims", {"slots": slots, "wait_ms": wait_ms})

    def claim_one(self, timeout_ms: int = 10000) -> dict[str, Any]:
        r = self.claim(1, timeout_ms)
        assert r.status_code == 200, r.text
        assert r.json()["leases"], "no lease within the wait"
        return r.json()["leases"][0]

    def complete(self, lease: dict[str, Any], result: dict[str, Any] | None = None) -> httpx.Response:
        body = {"lease_token": lease["lease_token"], "result": result or {"kind": "success", "output": {"ok": 1}}}
        return self.post(f"/leases/{lease['dispatch_id']}/complete", body)


# -- workflows ---------------------------------------------------------------------------------------------


def test_apply_workflow_creates_a_version_then_returns_it_for_an_identical_definition(http, gw):
    body = definition()
    first = apply(http, gw, body)
    assert first.status_code == 201 and first.json() == {"workflow_id": body["id"], "version": 1}
    again = apply(http, gw, body)
    assert again.status_code == 200 and again.json() == {"workflow_id": body["id"], "version": 1}
    body["concurrency"] = 3
    assert apply(http, gw, body).json()["version"] == 2


def test_apply_workflow_replayed_key_returns_the_first_answer_and_a_reused_key_conflicts(http, gw):
    body = definition()
    key = "key-" + secrets.token_hex(4)
    first = apply(http, gw, body, key)
    replay = apply(http, gw, body, key)
    assert (first.status_code, replay.status_code) == (201, 201)
    assert first.json() == replay.json()
    other = apply(http, gw, definition(), key)
    assert other.status_code == 409 and error_code(other) == "idempotency_conflict"


def test_apply_workflow_requires_an_idempotency_key(http, gw):
    r = http.post(f"{API}/workflows", json=definition(), headers=gw.auth("operator"))
    assert r.status_code == 400 and error_code(r) == "invalid_request"


@pytest.mark.parametrize(
    "body",
    [
        {"id": "bad id!", "tasks": [{"key": "a", "executor": "mock"}]},
        {"id": "x", "tasks": []},
        {"id": "x", "tasks": [{"key": "a", "executor": "shell"}]},
        {"id": "x", "tasks": [{"key": "a", "executor": "mock", "depends_on": ["a"]}]},
        {"id": "x", "tasks": [{"key": "a", "executor": "mock"}], "surprise": 1},
    ],
    ids=["bad-id", "no-tasks", "unknown-executor", "cycle", "unknown-field"],
)
def test_apply_workflow_rejects_invalid_definitions(http, gw, body):
    r = apply(http, gw, body)
    assert r.status_code == 400 and error_code(r) == "invalid_request"


@pytest.mark.parametrize(
    "raw",
    [b"", b"[]", b'"x"', b"{", b"{}{}", b'{"id": NaN}', b'{"a": 1, "a": 2}', b"\xff\xfe", b'{"id": "a\\u0000"}'],
    ids=["empty", "array", "string", "truncated", "two-objects", "nan", "duplicate-key", "not-utf8", "nul"],
)
def test_malformed_bodies_are_invalid_requests(http, gw, raw):
    headers = {**gw.auth("operator"), "Idempotency-Key": secrets.token_hex(8), "Content-Type": "application/json"}
    r = http.post(f"{API}/workflows", content=raw, headers=headers)
    assert r.status_code == 400 and error_code(r) == "invalid_request"


def test_workflow_bodies_up_to_16_mib_are_read_and_larger_ones_are_refused(http, gw):
    big_input = {"blob": "x" * (2 * 1024 * 1024)}  # 2 MiB: over the 1 MiB default, under 16 MiB
    r = apply(http, gw, definition(tasks=[{"key": "a", "executor": "mock", "input": big_input}]))
    assert r.status_code == 400 and "input" in r.json()["error"]["message"]  # read, then refused by the 64 KiB rule
    headers = {**gw.auth("operator"), "Idempotency-Key": secrets.token_hex(8), "Content-Type": "application/json"}
    r = http.post(f"{API}/workflows", content=b" " * (16 * 1024 * 1024 + 1), headers=headers)
    assert r.status_code == 413 and error_code(r) == "payload_too_large"


def test_a_10000_task_definition_fits(http, gw):
    tasks = [{"key": f"t{i:05d}", "executor": "mock", "action": "noop", "input": {"n": i}} for i in range(10_000)]
    r = apply(http, gw, definition(tasks=tasks))
    assert r.status_code == 201, r.text


def test_workflow_reads(http, gw):
    body = definition()
    apply(http, gw, body)
    body["concurrency"] = 2
    apply(http, gw, body)
    wid, viewer = body["id"], gw.auth("viewer")
    listed = http.get(f"{API}/workflows", headers=viewer).json()
    assert listed["next_cursor"] is None
    assert {"workflow_id": wid, "latest_version": 2}.items() <= next(
        w for w in listed["items"] if w["workflow_id"] == wid
    ).items()
    one = http.get(f"{API}/workflows/{wid}", headers=viewer)
    assert one.status_code == 200 and one.json()["latest_version"] == 2
    versions = http.get(f"{API}/workflows/{wid}/versions", headers=viewer).json()
    assert [v["version"] for v in versions["items"]] == [1, 2] and versions["next_cursor"] is None
    v2 = http.get(f"{API}/workflows/{wid}/versions/2", headers=viewer).json()
    assert v2["definition"]["concurrency"] == 2 and len(v2["definition_hash"]) == 64
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", v2["created_at"])


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/workflows/nope", 404, "not_found"),
        ("/workflows/nope/versions", 404, "not_found"),
        ("/workflows/nope/versions/1", 404, "not_found"),
        ("/workflows/nope/versions/x", 400, "invalid_request"),
        ("/runs/nope", 404, "not_found"),
        ("/runs/nope/tasks", 404, "not_found"),
        ("/runs/nope/tasks/a", 404, "not_found"),
        ("/runs/nope/events", 404, "not_found"),
        ("/workers/nope", 404, "not_found"),
        ("/runs?limit=0", 400, "invalid_request"),
        ("/runs?limit=101", 400, "invalid_request"),
        ("/runs?cursor=%%%", 400, "invalid_request"),
        ("/runs?status=sleeping", 400, "invalid_request"),
        ("/runs/nope/events?after=-1", 400, "invalid_request"),
        ("/no/such/route", 404, "not_found"),
    ],
)
def test_read_errors(http, gw, path, status, code):
    r = http.get(API + path, headers=gw.auth("viewer"))
    assert r.status_code == status and error_code(r) == code


def test_unknown_method_is_405_with_allow(http, gw):
    r = http.delete(f"{API}/workflows", headers=gw.auth("operator"))
    assert r.status_code == 405 and error_code(r) == "method_not_allowed"
    assert "GET" in r.headers["Allow"]


# -- runs --------------------------------------------------------------------------------------------------


def test_start_run_is_idempotent_per_key(http, gw):
    body = definition()
    apply(http, gw, body)
    body["concurrency"] = 5
    apply(http, gw, body)
    key = "run-" + secrets.token_hex(4)
    first = start(http, gw, body["id"], 1, key)
    assert first.status_code == 202 and first.json()["status"] == "pending"
    replay = start(http, gw, body["id"], 1, key)
    assert replay.status_code == 202 and replay.json() == first.json()
    other = start(http, gw, body["id"], 2, key)
    assert other.status_code == 409 and error_code(other) == "idempotency_conflict"


def test_start_run_errors(http, gw):
    body = definition()
    apply(http, gw, body)
    op = gw.auth("operator")
    r = http.post(f"{API}/workflows/{body['id']}/versions/1/runs", headers=op)
    assert r.status_code == 400 and error_code(r) == "invalid_request"  # no Idempotency-Key
    assert start(http, gw, "nope").status_code == 404
    assert start(http, gw, body["id"], 7).status_code == 404
    r = http.post(
        f"{API}/workflows/{body['id']}/versions/1/runs",
        json={"urgency": 1},
        headers={**op, "Idempotency-Key": "k-" + secrets.token_hex(4)},
    )
    assert r.status_code == 400 and error_code(r) == "invalid_request"
    r = http.post(
        f"{API}/workflows/{body['id']}/versions/1/runs",
        json={},
        headers={**op, "Idempotency-Key": secrets.token_hex(4)},
    )
    assert r.status_code == 202


def test_run_reads_and_cursor_paging(http, gw):
    body = definition()
    apply(http, gw, body)
    run_ids = [start(http, gw, body["id"]).json()["run_id"] for _ in range(3)]
    viewer = gw.auth("viewer")
    seen: list[str] = []
    cursor = None
    while True:
        params = {"workflow_id": body["id"], "limit": 2, **({"cursor": cursor} if cursor else {})}
        page = http.get(f"{API}/runs", params=params, headers=viewer).json()
        seen += [r["run_id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == run_ids[::-1]
    run = http.get(f"{API}/runs/{run_ids[0]}", headers=viewer).json()
    assert {"run_id", "workflow_id", "workflow_version", "status", "revision", "cancel_requested_at"} <= set(run)
    tasks = http.get(f"{API}/runs/{run_ids[0]}/tasks", headers=viewer).json()
    assert [t["task_key"] for t in tasks["items"]] == ["a", "b"] and tasks["next_cursor"] is None
    task = http.get(f"{API}/runs/{run_ids[0]}/tasks/b", headers=viewer).json()
    assert task["status"] == "waiting_dependencies" and task["attempt_history"] == []
    pending = http.get(f"{API}/runs", params={"status": "pending", "limit": 100}, headers=viewer)
    assert pending.status_code == 200 and all(r["status"] == "pending" for r in pending.json()["items"])


def test_events_page_with_after_and_limit(http, gw):
    _, run_id = new_run(http, gw)
    viewer = gw.auth("viewer")
    all_events = http.get(f"{API}/runs/{run_id}/events", headers=viewer).json()["items"]
    assert [e["sequence"] for e in all_events] == list(range(1, len(all_events) + 1))
    first = http.get(f"{API}/runs/{run_id}/events", params={"limit": 2}, headers=viewer).json()
    assert [e["sequence"] for e in first["items"]] == [1, 2] and first["next_cursor"] == "2"
    rest = http.get(f"{API}/runs/{run_id}/events", params={"after": 2}, headers=viewer).json()
    assert [e["sequence"] for e in rest["items"]] == list(range(3, len(all_events) + 1))
    assert (
        http.get(f"{API}/runs/{run_id}/events", params={"cursor": first["next_cursor"]}, headers=viewer).json() == rest
    )


def test_cancel_run(http, gw):
    _, run_id = new_run(http, gw)
    op = gw.auth("operator")
    r = http.post(f"{API}/runs/{run_id}/cancel", headers=op)
    assert r.status_code == 200
    assert r.json()["run_id"] == run_id and r.json()["status"] == "canceled" and r.json()["cancel_requested_at"]
    assert http.post(f"{API}/runs/{run_id}/cancel", json={}, headers=op).status_code == 200
    r = http.post(f"{API}/runs/{run_id}/cancel", json={"why": "x"}, headers=op)
    assert r.status_code == 400 and error_code(r) == "invalid_request"
    r = http.post(f"{API}/runs/nope/cancel", headers=op)
    assert r.status_code == 404 and error_code(r) == "not_found"


# -- the worker protocol -----------------------------------------------------------------------------------


def test_claim_on_complete_leases_the_dependant_the_completion_refilled(http, gw):
    """docs/protocol.md, Refill and claim on complete: with claim_slots, the dependant unlocked by the completion
    (refilled into the slot it freed) comes back as a new lease."""
    _, run_id = new_run(http, gw)
    w = Worker(http, gw, max_concurrency=1)
    lease = w.claim_one()
    body = {"lease_token": lease["lease_token"], "result": {"kind": "success"}, "claim_slots": 1}
    r = w.post(f"/leases/{lease['dispatch_id']}/complete", body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["applied"] is True
    [lease_b] = answer["leases"]
    assert (lease_b["run_id"], lease_b["task_key"], lease_b["attempt"]) == (run_id, "b", 1)
    # The replay is idempotent and claims nothing more: the worker's one slot is taken by b.
    replay = w.post(f"/leases/{lease['dispatch_id']}/complete", body)
    assert replay.status_code == 200 and replay.json() == {"applied": True, "leases": []}
    bad = w.post(f"/leases/{lease_b['dispatch_id']}/complete", {**body, "claim_slots": -1})
    assert bad.status_code == 400 and error_code(bad) == "invalid_request"
    assert w.complete(lease_b).json() == {"applied": True}


def test_a_run_goes_through_claim_heartbeat_complete(http, gw):
    _, run_id = new_run(http, gw)
    w = Worker(http, gw)
    lease = w.claim_one()
    assert lease["run_id"] == run_id and lease["task_key"] == "a" and lease["attempt"] == 1
    assert lease["lease_remaining_ms"] > 0 and lease["fencing_token"] > 0
    r = w.post("/heartbeat", {"leases": [{"dispatch_id": lease["dispatch_id"], "lease_token": lease["lease_token"]}]})
    assert r.status_code == 200 and r.headers["X-Worker-Protocol-Version"] == "1"
    assert r.json()["leases"][0]["status"] == "renewed"
    assert w.complete(lease).json() == {"applied": True}
    assert w.complete(lease).json() == {"applied": True}  # idempotent
    conflict = w.complete(lease, {"kind": "permanent_failure"})
    assert conflict.status_code == 409 and error_code(conflict) == "result_conflict"
    lease_b = w.claim_one()
    assert lease_b["task_key"] == "b"
    assert w.complete(lease_b).status_code == 200
    run = wait_until(
        lambda: (
            (r := http.get(f"{API}/runs/{run_id}", headers=gw.auth("viewer")).json())["status"] == "succeeded" and r
        ),
        what="run to succeed",
    )
    assert run["finished_at"]
    task = http.get(f"{API}/runs/{run_id}/tasks/a", headers=gw.auth("viewer")).json()
    assert task["attempts"] == 1 and task["attempt_history"][0]["output"] == {"ok": 1}
    assert task["attempt_history"][0]["status"] == "succeeded"


def test_register_errors(http, gw):
    boot = gw.auth("bootstrap")
    url = f"{API}/workers/register"
    body: dict[str, Any]
    for body in (
        {"executor_kinds": []},
        {"executor_kinds": ["shell"]},
        {"executor_kinds": ["mock"], "max_concurrency": 0},
        {"executor_kinds": ["mock"], "colour": "red"},
        {},
    ):
        r = http.post(url, json=body, headers=boot)
        assert r.status_code == 400 and error_code(r) == "invalid_request", body
    r = http.post(url, json={"executor_kinds": ["mock"], "protocol_version": 2}, headers=boot)
    assert r.status_code == 400 and error_code(r) == "worker_protocol_unsupported"
    r = http.post(url, json={"executor_kinds": ["mock"]}, headers={**boot, "X-Worker-Protocol-Version": "2"})
    assert r.status_code == 400 and error_code(r) == "worker_protocol_unsupported"


def test_worker_calls_need_the_protocol_header_but_the_session_is_checked_first(http, gw):
    w = Worker(http, gw)
    no_header = bearer(w.token)
    r = w.post("/claims", {"slots": 1}, headers=no_header)
    assert r.status_code == 400 and error_code(r) == "worker_protocol_unsupported"
    assert r.headers["X-Worker-Protocol-Version"] == "1"
    r = w.post("/claims", {"slots": 1}, headers={**no_header, "X-Worker-Protocol-Version": "2"})
    assert r.status_code == 400 and error_code(r) == "worker_protocol_unsupported"
    wrong = bearer("not-a-session")
    for path, body in (("/claims", {"slots": "many"}), ("/heartbeat", [1]), ("/drain", {"x": 1})):
        r = w.post(path, body, headers=wrong)  # no protocol header, bad body, bad session
        assert r.status_code == 401 and error_code(r) == "worker_session_invalid", path
    r = w.post("/claims", {"slots": 1}, headers={"X-Worker-Protocol-Version": "1"})
    assert r.status_code == 401 and error_code(r) == "unauthorized"


def test_claim_errors(http, gw):
    w = Worker(http, gw, max_concurrency=2)
    for body in (
        {"slots": 0},
        {"slots": 1.5},
        {"slots": True},
        {"slots": 1, "wait_ms": 30001},
        {"slots": 1, "x": 1},
        {},
    ):
        r = w.post("/claims", body)
        assert r.status_code == 400 and error_code(r) == "invalid_request", body
    r = w.claim(3)
    assert r.status_code == 409 and error_code(r) == "worker_capacity_exceeded"
    r = w.post("/claims", {"slots": 1}, headers={**w.headers, "Content-Type": "application/json"})
    assert r.status_code == 200
    big = {"slots": 1, "pad": "x" * (1024 * 1024)}
    r = w.post("/claims", big)
    assert r.status_code == 413 and error_code(r) == "payload_too_large"


def test_heartbeat_answers_per_lease(http, gw):
    _, run_id = new_run(http, gw)
    w, other = Worker(http, gw), Worker(http, gw)
    lease = w.claim_one()
    leases = [
        {"dispatch_id": lease["dispatch_id"], "lease_token": lease["lease_token"]},
        {"dispatch_id": lease["dispatch_id"], "lease_token": "wrong"},
        {"dispatch_id": "dsp_nope", "lease_token": "x"},
    ]
    r = w.post("/heartbeat", {"leases": leases})
    assert [x["status"] for x in r.json()["leases"]] == ["renewed", "unknown", "unknown"]
    assert other.post("/heartbeat", {"leases": leases[:1]}).json()["leases"][0]["status"] == "unknown"
    assert w.post("/heartbeat", {}).json() == {"leases": [], "worker_status": "active"}
    assert w.post("/heartbeat", {"leases": []}).status_code == 200
    http.post(f"{API}/runs/{run_id}/cancel", headers=gw.auth("operator"))
    assert w.post("/heartbeat", {"leases": leases[:1]}).json()["leases"][0]["status"] == "revoked"
    for body in ({"leases": [{"dispatch_id": "a"}]}, {"leases": "all"}, {"leases": [leases[0]] * 1025}):
        r = w.post("/heartbeat", body)
        assert r.status_code == 400 and error_code(r) == "invalid_request"


def test_release_answers_and_errors(http, gw):
    """POST .../leases/{id}/release (drain without loss, AWP issue 41): fenced, the task due again at once."""
    new_run(http, gw)
    w, other = Worker(http, gw), Worker(http, gw)
    lease = w.claim_one()
    path = f"/leases/{lease['dispatch_id']}/release"
    for body in ({"lease_token": lease["lease_token"]}, {"lease_token": lease["lease_token"], "reason": "bored"}):
        r = w.post(path, body)
        assert r.status_code == 400 and error_code(r) == "invalid_request", r.text
    assert "worker_shutdown" in w.post(path, {"lease_token": lease["lease_token"], "reason": "x"}).text
    for who, token in ((other, lease["lease_token"]), (w, "wrong")):
        r = who.post(path, {"lease_token": token, "reason": "worker_shutdown"})
        assert r.status_code == 409 and error_code(r) == "lease_lost", r.text
    r = w.post(path, {"lease_token": lease["lease_token"], "reason": "worker_shutdown"})
    assert r.status_code == 200 and r.json() == {"released": True, "task_status": "waiting_retry"}, r.text
    again = w.post(path, {"lease_token": lease["lease_token"], "reason": "worker_shutdown"})
    assert again.status_code == 409 and "the dispatch is expired" in again.json()["error"]["message"]


def test_complete_errors(http, gw):
    new_run(http, gw)
    w = Worker(http, gw)
    lease = w.claim_one()
    r = w.post(f"/leases/{lease['dispatch_id']}/complete", {"lease_token": "wrong", "result": {"kind": "success"}})
    assert r.status_code == 409 and error_code(r) == "lease_lost"
    r = w.post("/leases/dsp_nope/complete", {"lease_token": "x", "result": {"kind": "success"}})
    assert r.status_code == 409 and error_code(r) == "lease_lost"
    for result in (
        {"kind": "maybe"},
        {"kind": "success", "extra": 1},
        {"kind": "success", "output": "x" * 70000},
        {"kind": "permanent_failure", "error_code": "x" * 129},
        {"kind": "success", "error_message": 5},
    ):
        r = w.complete(lease, result)
        assert r.status_code == 400 and error_code(r) == "invalid_request", result
    r = w.post(f"/leases/{lease['dispatch_id']}/complete", {"result": {"kind": "success"}})
    assert r.status_code == 400
    assert w.complete(lease, {"kind": "temporary_failure", "error_code": "E", "error_message": "m"}).json() == {
        "applied": True
    }


def test_drain_stops_an_idle_worker_and_its_session_is_then_invalid(http, gw):
    w = Worker(http, gw)
    r = w.post("/drain")
    assert r.status_code == 200 and r.json()["status"] == "stopped" and r.json()["worker_id"] == w.id
    assert "session_token" not in r.json()
    r = w.claim()
    assert r.status_code == 401 and error_code(r) == "worker_session_invalid"


def test_a_draining_worker_may_not_claim(http, gw):
    new_run(http, gw)
    w = Worker(http, gw)
    lease = w.claim_one()
    assert w.post("/drain", {}).json()["status"] == "draining"
    r = w.claim()
    assert r.status_code == 409 and error_code(r) == "worker_draining"
    assert w.complete(lease).status_code == 200
    assert w.post("/drain").json()["status"] == "stopped"


def test_worker_reads_never_show_a_token(http, gw):
    w = Worker(http, gw)
    listed = http.get(f"{API}/workers", headers=gw.auth("viewer"))
    one = http.get(f"{API}/workers/{w.id}", headers=gw.auth("viewer"))
    assert one.status_code == 200 and one.json()["status"] == "active" and one.json()["active_leases"] == 0
    assert w.id in {x["worker_id"] for x in listed.json()["items"]}
    assert w.token not in listed.text + one.text and "token" not in listed.text + one.text


# -- long-poll claims --------------------------------------------------------------------------------------


def test_claim_with_wait_ms_0_answers_at_once(http, gw):
    w = Worker(http, gw)
    # No long poll: the answer comes at once. The 5 s client timeout only bounds a hang (a request that
    # long-polled anyway would wait far longer than that before answering empty).
    r = http.post(f"{API}/workers/{w.id}/claims", json={"slots": 1, "wait_ms": 0}, headers=w.headers, timeout=5)
    assert r.json() == {"leases": []}


def test_long_poll_returns_empty_when_the_wait_ends(http, gw):
    w = Worker(http, gw)
    started = time.monotonic()
    r = w.claim(1, 1500)
    elapsed = time.monotonic() - started
    assert r.json() == {"leases": []}
    assert elapsed >= 1.4, "it waited (the client timeout of 40 s bounds the other side)"


def test_long_poll_returns_promptly_when_work_appears(http, gw, db_dsn):
    w = Worker(http, gw)
    answer: dict[str, Any] = {}
    with psycopg.connect(db_dsn, autocommit=True) as c:
        # Make the request's first (empty) claim visible: a claim records liveness when the last heartbeat is
        # more than half an interval (1 s here) old.
        c.execute("UPDATE awp.workers SET last_heartbeat_at = now() - interval '1.5 s' WHERE worker_id = %s", [w.id])
        before = one(c, "SELECT last_heartbeat_at FROM awp.workers WHERE worker_id = %s", [w.id])[0]

        def poll() -> None:
            # Client timeout 15 s < wait_ms 20 s: an answer at all means the work woke the request up.
            with httpx.Client(base_url=gw.base_url, timeout=15) as client:
                r = client.post(f"{API}/workers/{w.id}/claims", json={"slots": 1, "wait_ms": 20000}, headers=w.headers)
                answer.update(response=r)

        thread = threading.Thread(target=poll)
        thread.start()
        wait_until(
            lambda: one(c, "SELECT last_heartbeat_at FROM awp.workers WHERE worker_id = %s", [w.id])[0] > before,
            10,
            0.01,
            "the request's first claim (it found nothing and is now waiting)",
        )
    _, run_id = new_run(http, gw)
    thread.join(20)
    assert not thread.is_alive()
    leases = answer["response"].json()["leases"]
    assert leases and leases[0]["run_id"] == run_id


def test_idle_long_polls_do_not_query_per_millisecond(http, gw, db_dsn):
    workers = [Worker(http, gw) for _ in range(20)]
    with psycopg.connect(db_dsn, autocommit=True) as c:

        def commits() -> int:
            return one(c, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")[0]

        c.execute("SELECT pg_stat_clear_snapshot()")
        before = commits()
        threads = [
            threading.Thread(
                target=lambda w=w: httpx.post(
                    gw.api(f"/workers/{w.id}/claims"), json={"slots": 1, "wait_ms": 2000}, headers=w.headers, timeout=30
                )
            )
            for w in workers
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        time.sleep(0.6)  # pg_stat counters are flushed by backends at most every ~0.5 s
        c.execute("SELECT pg_stat_clear_snapshot()")
        spent = commits() - before
    # 20 workers x 2 s: per-millisecond polling would be ~40,000 transactions; re-checks every ~0.5 s plus
    # the coordinator's passes (every 100 ms here) are a few hundred at most.
    assert spent < 1000, spent


# -- auth --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ids(http: httpx.Client, gw: ServeProcess) -> dict[str, str]:
    body = definition()
    apply(http, gw, body)
    run_id = start(http, gw, body["id"]).json()["run_id"]
    return {"wid": body["id"], "run": run_id, "worker": Worker(http, gw).id}


READ_ROUTES = [
    "/workflows",
    "/workflows/{wid}",
    "/workflows/{wid}/versions",
    "/workflows/{wid}/versions/1",
    "/runs",
    "/runs/{run}",
    "/runs/{run}/tasks",
    "/runs/{run}/tasks/a",
    "/runs/{run}/events",
    "/workers",
    "/workers/{worker}",
]
WRITE_ROUTES = ["/workflows", "/workflows/{wid}/versions/1/runs", "/runs/{run}/cancel"]
WORKER_ROUTES = ["/claims", "/heartbeat", "/leases/dsp_x/complete", "/leases/dsp_x/release", "/drain"]


@pytest.mark.parametrize("path", READ_ROUTES)
@pytest.mark.parametrize(
    ("role", "status"),
    [("viewer", 200), ("operator", 200), ("bootstrap", 401), ("session", 401), ("wrong", 401), ("none", 401)],
)
def test_auth_matrix_read_routes(http, gw, ids, path, role, status):
    r = http.get(API + path.format(**ids), headers=role_headers(http, gw, role))
    assert r.status_code == status, r.text
    if status == 401:
        assert error_code(r) == "unauthorized"


@pytest.mark.parametrize("path", WRITE_ROUTES)
@pytest.mark.parametrize(
    ("role", "status"),
    [("viewer", 403), ("operator", None), ("bootstrap", 401), ("session", 401), ("wrong", 401), ("none", 401)],
)
def test_auth_matrix_write_routes(http, gw, ids, path, role, status):
    body = definition() if path == "/workflows" else {}
    headers = {**role_headers(http, gw, role), "Idempotency-Key": secrets.token_hex(8)}
    r = http.post(API + path.format(**ids), json=body, headers=headers)
    if status is None:
        assert r.status_code in (200, 201, 202), r.text
    else:
        assert r.status_code == status and error_code(r) == {403: "forbidden", 401: "unauthorized"}[status]


@pytest.mark.parametrize(
    ("role", "status", "code"),
    [
        ("bootstrap", 201, None),
        ("viewer", 403, "forbidden"),
        ("operator", 403, "forbidden"),
        ("session", 401, "unauthorized"),
        ("wrong", 401, "unauthorized"),
        ("none", 401, "unauthorized"),
    ],
)
def test_auth_matrix_register(http, gw, role, status, code):
    r = http.post(f"{API}/workers/register", json={"executor_kinds": ["mock"]}, headers=role_headers(http, gw, role))
    assert r.status_code == status
    if code:
        assert error_code(r) == code


@pytest.mark.parametrize("path", WORKER_ROUTES)
@pytest.mark.parametrize(
    ("role", "code"),
    [
        ("session", None),
        ("viewer", "worker_session_invalid"),
        ("operator", "worker_session_invalid"),
        ("bootstrap", "worker_session_invalid"),
        ("wrong", "worker_session_invalid"),
        ("none", "unauthorized"),
    ],
)
def test_auth_matrix_worker_routes(http, gw, path, role, code):
    w = Worker(http, gw)
    body = {
        "claims": {"slots": 1},
        "heartbeat": {"leases": []},
        "complete": {"lease_token": "x", "result": {"kind": "success"}},
        "release": {"lease_token": "x", "reason": "worker_shutdown"},
    }
    headers = {**PROTOCOL, **(bearer(w.token) if role == "session" else role_headers(http, gw, role))}
    r = w.post(path, body.get(path.rsplit("/", 1)[-1], {}), headers=headers)
    if path == "/drain" and role in ("viewer", "operator"):  # an operator may drain any worker (AWP issue 41)
        assert (r.status_code, error_code(r) if role == "viewer" else r.json()["status"]) == (
            (403, "forbidden") if role == "viewer" else (200, "draining")
        ), r.text
    elif code is None:
        assert r.status_code in (200, 409), r.text  # complete/release of an unknown dispatch: lease_lost
    else:
        assert r.status_code == 401 and error_code(r) == code


def role_headers(http: httpx.Client, gw: ServeProcess, role: str) -> dict[str, str]:
    if role in ("viewer", "operator", "bootstrap"):
        return gw.auth(role)
    if role == "session":
        return bearer(Worker(http, gw).token)
    if role == "wrong":
        return bearer("wrong-" + secrets.token_hex(8))
    return {}


def test_the_gateway_refuses_to_start_with_equal_empty_or_short_secrets(db_dsn):
    same = secrets.token_urlsafe(32)
    cases = {
        "must all differ": Tokens(viewer=same, operator=same),
        "bootstrap token is empty": Tokens(bootstrap=""),
        "viewer token has 31 characters, fewer than 32": Tokens(viewer="v" * 31),
    }
    for message, tokens in cases.items():
        env = {"AWP_DATABASE_URL": db_dsn, **tokens.env(), "PATH": "/usr/bin:/bin"}
        proc = subprocess.run(
            awp_command("serve", "--port", "1"),
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode != 0
        assert message in proc.stderr, proc.stderr


# -- health, metrics, request ids --------------------------------------------------------------------------


def test_health_and_request_ids(http, gw):
    live = http.get("/health/live")
    assert live.status_code == 200 and live.headers["X-Request-Id"]
    ready = http.get("/health/ready").json()
    assert ready["status"] == "ready" and ready["coordinator_active"] is True and ready["coordinator"] == "active"
    r = http.get(f"{API}/workflows", headers={**gw.auth("viewer"), "X-Request-Id": "trace-123"})
    assert r.headers["X-Request-Id"] == "trace-123"
    assert http.get("/nope").headers["X-Request-Id"]


def test_every_answer_says_nosniff(http, gw):
    """``X-Content-Type-Options: nosniff`` on every answer (issue 44): JSON, errors, metrics, health, the
    dashboard, and the answers of the HTTP parser's layer (python/awp/server/webserver.py)."""
    operator = {**gw.auth("operator"), "Idempotency-Key": secrets.token_hex(8)}
    answers = [
        http.get("/health/live"),
        http.get("/health/ready"),
        http.get("/metrics"),
        http.get(f"{API}/openapi.yaml"),
        http.get("/ui/"),
        http.get(f"{API}/runs", headers=gw.auth("viewer")),
        http.post(f"{API}/workflows", content=b"{", headers=operator),  # 400
        http.get(f"{API}/runs"),  # 401
        http.get(f"{API}/runs", headers=bearer("wrong-" + secrets.token_hex(20))),  # 401
        http.post(f"{API}/workflows", json={}, headers=gw.auth("viewer")),  # 403
        http.get(f"{API}/runs/run_nope", headers=gw.auth("viewer")),  # 404
        http.get("/no/such/route"),  # 404
        http.delete(f"{API}/workflows", headers=gw.auth("operator")),  # 405
    ]
    assert {r.status_code for r in answers} >= {200, 400, 401, 403, 404, 405}
    for r in answers:
        assert r.headers.get("X-Content-Type-Options") == "nosniff", (r.request.method, r.request.url, r.status_code)
    refused = exchange(gw.port, b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n")
    assert refused is not None and refused.status == 400, refused
    assert refused.headers.get("x-content-type-options") == "nosniff", refused.headers


def test_metrics(http, gw):
    new_run(http, gw)
    w = Worker(http, gw)
    w.claim_one()
    w.claim(1, 0)
    text = http.get("/metrics").text
    for name in (
        'awp_http_requests_total{method="POST",route="/api/v1/workers/{worker_id}/claims",status="200"}',
        "awp_http_request_duration_seconds_bucket",
        'awp_claims_total{result="empty"}',
        'awp_claims_total{result="leased"}',
        "awp_leases_active 1.0",
        'awp_dispatches{status="leased"}',
        'awp_runs{status="running"}',
        "awp_coordinator_active 1.0",
        "awp_coordinator_passes_total",
        'awp_coordinator_items_total{kind="dispatched"}',
        "awp_reaped_leases_total",
    ):
        assert name in text, name
    assert re.search(r"^awp_coordinator_passes_total [1-9]", text, re.M)


def test_metrics_token_when_configured(db_dsn):
    metrics_token = "metrics-" + secrets.token_urlsafe(32)
    with serve(db_dsn, env={"AWP_METRICS_TOKEN": metrics_token}, args=["--no-coordinator"]) as other:
        assert httpx.get(other.url("/metrics")).status_code == 401
        assert httpx.get(other.url("/metrics"), headers=bearer(metrics_token)).status_code == 200
        state = other.ready()
        assert state is not None and state["coordinator"] == "disabled"


# -- the OpenAPI contract ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openapi(http: httpx.Client) -> dict[str, Any]:
    r = http.get(f"{API}/openapi.yaml")
    assert r.status_code == 200
    return yaml.safe_load(r.text)


async def test_every_route_of_the_app_is_in_the_openapi_file_and_vice_versa(openapi):
    viewer, operator, bootstrap = (f"{r}-{secrets.token_urlsafe(32)}" for r in "vob")
    app = create_app(GatewayConfig("postgresql:///unused", viewer, operator, bootstrap))
    routes: list[tuple[str, str]] = []
    for r in app.router.routes():
        assert r.resource is not None, r
        if r.method not in ("HEAD", "*"):
            routes.append((r.method.lower(), r.resource.canonical))
    # The dashboard's HTML pages (/ui, awp.server.ui) are not part of the HTTP API: not in the OpenAPI file.
    in_app = {(method, path) for method, path in routes if not path.startswith("/ui")}
    assert any(path.startswith("/ui/") for _, path in routes)
    in_file = {(method, path) for path, ops in openapi["paths"].items() for method in ops if method != "parameters"}
    assert in_app == in_file
    await app[DB].close()


CHECKS = {
    "RunStatus": "run_status_is_valid",
    "TaskStatus": "task_status_is_valid",
    "AttemptStatus": "attempt_status_is_valid",
    "DispatchStatus": "dispatch_status_is_valid",
    "WorkerStatus": "worker_status_is_valid",
}


@pytest.mark.parametrize("schema", sorted(CHECKS))
def test_openapi_status_enums_equal_the_database_checks(openapi, conn, schema):
    row = conn.execute(
        "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace "
        "WHERE n.nspname = 'awp' AND c.conname = %s",
        (CHECKS[schema],),
    ).fetchone()
    assert row is not None, CHECKS[schema]
    allowed = set(re.findall(r"'([a-z_]+)'::text", row[0]))
    assert allowed and set(openapi["components"]["schemas"][schema]["enum"]) == allowed


def test_openapi_heartbeat_statuses_are_the_ones_the_database_answers(openapi, conn):
    source = conn.execute(
        "SELECT prosrc FROM pg_proc"
        " WHERE oid = 'awp.heartbeat(text, text, jsonb, bigint, bigint[], jsonb)'::regprocedure"
    ).fetchone()[0]
    answered = set(re.findall(r"(?:THEN|ELSE) '([a-z_]+)'", source))
    assert (
        set(openapi["components"]["schemas"]["HeartbeatLeaseStatus"]["enum"])
        == answered
        == {
            "renewed",
            "revoked",
            "unknown",
        }
    )
