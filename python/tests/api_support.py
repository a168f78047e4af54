"""Helpers of the HTTP API tests (python/tests/integration/test_gateway_api.py, test_gateway_contract.py): the
error envelope's code, workflow definitions, applying and starting them, and a worker that speaks the protocol by
hand (register, claim, complete)."""

from __future__ import annotations

import secrets
from typing import Any

import httpx

from awp_testing.gateway import PROTOCOL, ServeProcess, bearer

API = "/api/v1"


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
