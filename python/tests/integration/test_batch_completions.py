"""Several results in one request: ``POST /workers/{id}/completions`` over HTTP, and real workers with several
slots that use it (each result answered on its own; the freed slots claimed in the same transaction)."""

from __future__ import annotations

import re

import httpx
import psycopg
import pytest
from worker_support import (
    SHORT_LEASES,
    Workers,
    all_items,
    apply,
    mock_task,
    start_run,
    task,
    wait_run,
)

from awp_testing.gateway import PROTOCOL, ServeProcess, bearer, wait_until

GATEWAY_SETTINGS = SHORT_LEASES
GATEWAY_OPTIONS = {"coordinator_interval_ms": 200}


class HandWorker:
    """A worker speaking the protocol by hand."""

    def __init__(self, gw: ServeProcess, slots: int) -> None:
        r = httpx.post(
            gw.api("/workers/register"),
            json={"executor_kinds": ["mock"], "max_concurrency": slots},
            headers=gw.auth("bootstrap"),
            timeout=10,
        )
        assert r.status_code == 201, r.text
        self.gw, self.id = gw, r.json()["worker_id"]
        self.headers = {**bearer(r.json()["session_token"]), **PROTOCOL}

    def post(self, path: str, body: object) -> httpx.Response:
        return httpx.post(self.gw.api(f"/workers/{self.id}{path}"), json=body, headers=self.headers, timeout=10)

    def claim(self, slots: int) -> list[dict]:
        r = self.post("/claims", {"slots": slots, "wait_ms": 2000})
        assert r.status_code == 200, r.text
        return r.json()["leases"]


def item(lease: dict, result: dict | None = None, token: str | None = None) -> dict:
    return {
        "dispatch_id": lease["dispatch_id"],
        "lease_token": token or lease["lease_token"],
        "result": result or {"kind": "success", "output": {"task": lease["task_key"]}},
    }


def test_each_result_is_answered_on_its_own_and_freed_slots_are_claimed(gw: ServeProcess) -> None:
    hand = HandWorker(gw, slots=4)
    run_id = start_run(
        gw, apply(gw, {"id": "batch-hand", "concurrency": 4, "tasks": [mock_task(f"t{i}") for i in range(8)]})
    )
    leases = wait_until(lambda: [x for x in hand.claim(4) if x["run_id"] == run_id] or None, 10, 0.05, "leases")
    while len(leases) < 4:
        leases += [x for x in hand.claim(4 - len(leases)) if x["run_id"] == run_id]
    good, stale, bad, other = leases
    body = {
        "results": [
            item(good),
            item(stale, token="not-the-token"),
            item(bad, {"kind": "success", "output": "x" * 70000}),
            item(other),
        ],
        "claim_slots": 4,
    }
    r = hand.post("/completions", body)
    assert r.status_code == 200, r.text
    answers = r.json()["results"]
    assert [a["dispatch_id"] for a in answers] == [x["dispatch_id"] for x in leases]
    assert answers[0] == {"dispatch_id": good["dispatch_id"], "applied": True}
    assert answers[1]["error"]["code"] == "lease_lost"
    assert answers[2]["error"]["code"] == "invalid_request" and "65536" in answers[2]["error"]["message"]
    assert answers[3] == {"dispatch_id": other["dispatch_id"], "applied": True}
    new = r.json()["leases"]
    assert len(new) == 2, "two slots were freed (two results applied); the refused ones still hold theirs"
    assert {x["task_key"] for x in new}.isdisjoint({x["task_key"] for x in leases})
    assert task(gw, run_id, good["task_key"])["attempt_history"][0]["output"] == {"task": good["task_key"]}

    # A replay of the whole batch: the applied ones answer applied again (idempotent), nothing runs twice.
    again = hand.post("/completions", {"results": [item(good), item(other)]})
    assert [a.get("applied") for a in again.json()["results"]] == [True, True]
    # A different result for an applied lease is a conflict, answered per item.
    conflict = hand.post("/completions", {"results": [item(good, {"kind": "success", "output": 1})]})
    assert conflict.json()["results"][0]["error"]["code"] == "result_conflict"
    for lease in [stale, bad, *new]:
        assert hand.post("/completions", {"results": [item(lease)]}).json()["results"][0]["applied"] is True
    rest = wait_until(lambda: [x for x in hand.claim(4) if x["run_id"] == run_id] or None, 10, 0.05, "the rest")
    while rest:
        answer = hand.post("/completions", {"results": [item(x) for x in rest], "claim_slots": 4}).json()
        assert all(a.get("applied") for a in answer["results"])
        rest = answer["leases"]
    assert wait_run(gw, run_id)["status"] == "succeeded"
    hand.post("/drain", {})


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"results": []}, "results must be a list of 1-256"),
        ({"results": [{"dispatch_id": "d", "lease_token": "t"}]}, "result"),
        ({"results": [{"dispatch_id": "d", "lease_token": "t", "result": {"kind": "maybe"}}]}, "result.kind"),
        ({"results": [{"dispatch_id": "d", "lease_token": "t", "result": {"kind": "success"}}] * 2}, "twice"),
        ({"results": "nope"}, "results must be a list"),
    ],
)
def test_malformed_batches_are_400(gw: ServeProcess, body: dict, fragment: str) -> None:
    hand = HandWorker(gw, slots=1)
    r = hand.post("/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_request" and fragment in r.json()["error"]["message"]
    hand.post("/drain", {})


def requests_by_route(gw: ServeProcess) -> dict[str, float]:
    text = httpx.get(gw.url("/metrics"), headers=gw.auth("operator"), timeout=10).text
    out: dict[str, float] = {}
    for m in re.finditer(r'awp_http_requests_total\{method="POST",route="([^"]+)",status="200"\} ([0-9.e+]+)', text):
        out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def test_a_worker_with_several_slots_sends_results_in_batches(gw: ServeProcess, workers: Workers, db_dsn: str) -> None:
    before = requests_by_route(gw)
    workers.start("batcher", concurrency=8)
    n = 200
    run_id = start_run(
        gw,
        apply(gw, {"id": "batch-real", "concurrency": 8, "tasks": [mock_task(f"t{i}", sleep_ms=5) for i in range(n)]}),
    )
    assert wait_run(gw, run_id, timeout=60)["status"] == "succeeded"
    after = requests_by_route(gw)
    route = "/api/v1/workers/{worker_id}/completions"
    batches = after.get(route, 0) - before.get(route, 0)
    singles = after.get("/api/v1/workers/{worker_id}/leases/{dispatch_id}/complete", 0) - before.get(
        "/api/v1/workers/{worker_id}/leases/{dispatch_id}/complete", 0
    )
    assert singles == 0, "a worker with several slots uses the batch route"
    assert 0 < batches < n, f"{n} results in {batches} requests"
    assert all(t["status"] == "succeeded" for t in all_items(gw, f"/runs/{run_id}/tasks"))
    with psycopg.connect(db_dsn) as c:
        assert c.execute("SELECT * FROM awp.check_invariants()").fetchall() == []


def test_no_batch_keeps_one_request_per_result(gw: ServeProcess, workers: Workers) -> None:
    before = requests_by_route(gw)
    workers.start("single", concurrency=4, extra=["--no-batch"])
    run_id = start_run(
        gw, apply(gw, {"id": "batch-off", "concurrency": 4, "tasks": [mock_task(f"t{i}") for i in range(20)]})
    )
    assert wait_run(gw, run_id)["status"] == "succeeded"
    after = requests_by_route(gw)
    route = "/api/v1/workers/{worker_id}/completions"
    assert after.get(route, 0) == before.get(route, 0)
