"""A bounded schemathesis fuzz run against the OpenAPI file served by a real ``awp serve``: no 5xx, and
every answer conforms to the documented status codes, content types, headers and schemas (all of schemathesis'
checks). ``AWP_FUZZ_EXAMPLES`` examples per operation: 6 in ``make test``, 200 in ``make fuzz``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from awp_testing.gateway import PROTOCOL, ServeProcess, bearer

schemathesis.experimental.OPEN_API_3_1.enable()

MAX_EXAMPLES = int(os.environ.get("AWP_FUZZ_EXAMPLES", "6"))  # per operation (~22): 6 stays well under a minute


GATEWAY_SETTINGS = {"lease_duration_ms": 10000, "heartbeat_interval_ms": 2000}
GATEWAY_OPTIONS = {"coordinator_interval_ms": 200}


@pytest.fixture(scope="module")
def fuzz_gw(gw: ServeProcess) -> ServeProcess:
    """The module's gateway (conftest.py) with workflow ``fuzz`` and a run of it."""
    op = {**gw.auth("operator"), "Idempotency-Key": "fuzz-seed"}
    wf = {"id": "fuzz", "tasks": [{"key": "a", "executor": "mock"}]}
    httpx.post(gw.api("/workflows"), json=wf, headers=op).raise_for_status()
    httpx.post(gw.api("/workflows/fuzz/versions/1/runs"), headers=op).raise_for_status()
    return gw


@pytest.fixture(scope="module")
def api_schema(fuzz_gw: ServeProcess) -> schemathesis.schemas.BaseSchema:
    return schemathesis.from_uri(fuzz_gw.url("/api/v1/openapi.yaml"), base_url=fuzz_gw.base_url)


schema = schemathesis.from_pytest_fixture("api_schema")


def headers_for(gw: ServeProcess, path: str) -> dict[str, str]:
    if path.endswith("/register"):
        return gw.auth("bootstrap")
    if path.startswith("/api/v1/workers/{worker_id}/"):
        return {}
    return gw.auth("operator")


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors_and_answers_match_the_schema(case: schemathesis.Case, fuzz_gw: ServeProcess) -> None:
    path = case.operation.path
    headers = headers_for(fuzz_gw, path)
    if path.startswith("/api/v1/workers/{worker_id}/"):
        # A real session half of the time (the path's worker id is the fuzzed one otherwise).
        r = httpx.post(
            fuzz_gw.api("/workers/register"), json={"executor_kinds": ["mock"]}, headers=fuzz_gw.auth("bootstrap")
        )
        worker = r.json()
        case.path_parameters = {**(case.path_parameters or {}), "worker_id": worker["worker_id"]}
        headers = {**bearer(worker["session_token"]), **PROTOCOL}
        if isinstance(case.body, dict) and isinstance(case.body.get("wait_ms"), int):
            case.body["wait_ms"] = min(case.body["wait_ms"], 50)  # keep long-polls short
    generated: Mapping[str, Any] = case.headers or {}
    case.call_and_validate(headers={**generated, **headers}, timeout=30)
