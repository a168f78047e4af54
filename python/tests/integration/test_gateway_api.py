"""The HTTP API of ``awp serve`` (python/awp/openapi.yaml) against a real process and a real PostgreSQL:
every route's success and documented errors, body limits, idempotency keys and long-poll claims. The auth matrix,
health, metrics and the OpenAPI contract: test_gateway_contract.py."""

from __future__ import annotations

import re
import secrets
import threading
import time
from typing import Any

import httpx
import psycopg
import pytest
from api_support import API, Worker, apply, definition, error_code, new_run, start

from awp_testing.cluster import one
from awp_testing.gateway import bearer, wait_until

GATEWAY_SETTINGS = {"lease_duration_ms": 10000, "heartbeat_interval_ms": 2000}


pytestmark = pytest.mark.usefixtures("no_live_runs")  # conftest.py


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
