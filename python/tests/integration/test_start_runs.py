"""Starting many runs in one call (AWP issue 46): POST /api/v1/workflows/{id}/versions/{v}/runs/batch against a real
``awp serve`` and PostgreSQL: one Idempotency-Key per item, all or nothing, the limits of a single start."""

from __future__ import annotations

import secrets
from typing import Any

import httpx
import psycopg
import pytest

from awp_testing.gateway import ServeProcess

API = "/api/v1"
BATCH = API + "/workflows/wf/versions/1/runs/batch"


@pytest.fixture(scope="module")
def gw(gw: ServeProcess) -> ServeProcess:
    """The module's gateway (conftest.py) with workflow ``wf`` of one mock task defined."""
    tasks = [{"key": "a", "executor": "mock"}]
    r = httpx.post(
        gw.api("/workflows"),
        json={"id": "wf", "tasks": tasks},
        headers={**gw.auth("operator"), "Idempotency-Key": "wf"},
    )
    assert r.status_code == 201, r.text
    return gw


def post(gw: ServeProcess, body: Any, role: str = "operator", path: str = BATCH) -> httpx.Response:
    return httpx.post(gw.url(path), json=body, headers=gw.auth(role), timeout=30)


def key() -> str:
    return "k-" + secrets.token_hex(8)


def run_count(db_dsn: str) -> int:
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM awp.runs").fetchone()
        assert row is not None
        return int(row[0])


def error(r: httpx.Response) -> tuple[int, str, str]:
    body = r.json()["error"]
    return r.status_code, body["code"], body["message"]


def test_a_batch_starts_one_run_per_item_in_order(gw: ServeProcess, db_dsn: str) -> None:
    keys = [key() for _ in range(3)]
    items = [
        {"idempotency_key": keys[0]},
        {"idempotency_key": keys[1], "input": {"n": 1}},
        {"idempotency_key": keys[2]},
    ]
    r = post(gw, {"runs": items})
    assert r.status_code == 202, r.text
    runs = r.json()["runs"]
    assert [set(x) for x in runs] == [{"run_id", "status", "replayed"}] * 3
    assert [x["replayed"] for x in runs] == [False] * 3 and len({x["run_id"] for x in runs}) == 3
    with psycopg.connect(db_dsn) as conn:
        stored = conn.execute(
            "SELECT run_id, input FROM awp.runs WHERE run_id = ANY(%s)", ([x["run_id"] for x in runs],)
        ).fetchall()
    assert dict(stored)[runs[1]["run_id"]] == {"n": 1} and dict(stored)[runs[0]["run_id"]] == {}
    again = post(gw, {"runs": items})  # a replay of the whole call: the first answers
    assert again.status_code == 202
    assert [x["run_id"] for x in again.json()["runs"]] == [x["run_id"] for x in runs]
    assert [x["replayed"] for x in again.json()["runs"]] == [True] * 3


def test_a_batch_item_and_a_single_start_with_one_key_are_one_request(gw: ServeProcess) -> None:
    k = key()
    single = httpx.post(
        gw.api("/workflows/wf/versions/1/runs"),
        json={"input": {"x": 1}},
        headers={**gw.auth("operator"), "Idempotency-Key": k},
    )
    assert single.status_code == 202, single.text
    r = post(gw, {"runs": [{"idempotency_key": k, "input": {"x": 1}}]})
    assert r.status_code == 202
    assert r.json()["runs"] == [{"run_id": single.json()["run_id"], "status": "pending", "replayed": True}]


def test_all_or_nothing(gw: ServeProcess, db_dsn: str) -> None:
    used = key()
    assert post(gw, {"runs": [{"idempotency_key": used, "input": {"a": 1}}]}).status_code == 202
    before = run_count(db_dsn)
    r = post(gw, {"runs": [{"idempotency_key": key()}, {"idempotency_key": used, "input": {"a": 2}}]})
    status, code, message = error(r)
    assert (status, code) == (409, "idempotency_conflict") and "runs[1]" in message, r.text
    r = post(gw, {"runs": [{"idempotency_key": key()}, {"idempotency_key": key(), "input": {"x": "y" * 70_000}}]})
    status, code, message = error(r)
    assert (status, code) == (400, "invalid_request") and "runs[1]" in message and "65536-byte limit" in message
    assert run_count(db_dsn) == before, "a refused call started nothing"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "missing fields: runs"),
        ({"runs": {}}, "runs must be an array of 1-1000 objects"),
        ({"runs": []}, "runs must be an array of 1-1000 objects"),
        ({"runs": [{"idempotency_key": f"k{i}"} for i in range(1001)]}, "runs must be an array of 1-1000 objects"),
        ({"runs": [{"input": {}}]}, "runs[0]: idempotency_key must be a string of 1-255 characters"),
        ({"runs": [{"idempotency_key": "a", "inputs": {}}]}, "runs[0]: unknown fields: inputs"),
        (
            {"runs": [{"idempotency_key": "a"}, {"idempotency_key": "b", "input": [1]}]},
            "runs[1]: input must be a JSON object",
        ),
        ({"runs": [{"idempotency_key": "x" * 256}]}, "runs[0]: idempotency_key must be a string of 1-255 characters"),
        ({"runs": [{"idempotency_key": "a"}], "extra": 1}, "unknown fields: extra"),
    ],
)
def test_bad_batches_are_400_and_start_nothing(gw: ServeProcess, db_dsn: str, body: Any, says: str) -> None:
    before = run_count(db_dsn)
    status, code, message = error(post(gw, body))
    assert (status, code) == (400, "invalid_request") and says in message, message
    assert run_count(db_dsn) == before


def test_unknown_workflow_roles_and_methods(gw: ServeProcess) -> None:
    items = {"runs": [{"idempotency_key": key()}]}
    assert error(post(gw, items, path=API + "/workflows/nope/versions/1/runs/batch"))[:2] == (404, "not_found")
    assert error(post(gw, items, path=API + "/workflows/wf/versions/7/runs/batch"))[:2] == (404, "not_found")
    assert post(gw, items, role="viewer").status_code == 403
    assert httpx.post(gw.url(BATCH), json=items).status_code == 401
    assert httpx.get(gw.url(BATCH), headers=gw.auth("operator")).status_code == 405
