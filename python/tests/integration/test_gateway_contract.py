"""The HTTP API of ``awp serve`` (python/awp/openapi.yaml) against a real process and a real PostgreSQL, the rules
every route shares: the auth matrix, health and request ids, metrics, and the OpenAPI contract (routes and status
enums). Each route's own answers: test_gateway_api.py."""

from __future__ import annotations

import re
import secrets
import subprocess
from typing import Any

import httpx
import pytest
import yaml
from api_support import API, Worker, apply, definition, error_code, new_run, start
from raw_http import exchange

from awp.dev.procs import awp_command
from awp.server.app import create_app
from awp.server.appstate import DB, GatewayConfig
from awp_testing.gateway import PROTOCOL, ServeProcess, Tokens, bearer, serve

GATEWAY_SETTINGS = {"lease_duration_ms": 10000, "heartbeat_interval_ms": 2000}


pytestmark = pytest.mark.usefixtures("no_live_runs")  # conftest.py


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
    # Every named rule, a CHECK constraint's or one of a table's rules function (migration 0025_table_rules).
    row = conn.execute("SELECT definition FROM awp.check_rules WHERE rule = %s", (CHECKS[schema],)).fetchone()
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
