"""An async client of the gateway's HTTP API (``/api/v1``), used by the worker and the CLI.

Errors (all :class:`ClientError`): an error answer of the gateway raises :class:`GatewayError` (``code`` is the
API's error code, e.g. ``lease_lost``; not :class:`awp.server.errors.ApiError`, the error the gateway answers *with*);
a request that got no answer (connection refused, reset, timeout) raises :class:`TransportError`.
``GatewayError.retryable`` tells whether the same request may simply be sent again later (5xx, 503).

TLS: an ``https://`` base URL is verified against ``ca_file`` (PEM) when given, else the system's trust
store; a certificate that does not verify is a :class:`TransportError` (never sent in the clear).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp

from awp.protocol.limits import PROTOCOL_HEADER, PROTOCOL_VERSION
from awp.protocol.wire import Completion, Lease, LeaseRef, OutputWrite, ProgressItem, Result


class ClientError(Exception):
    """Base of the client's errors."""


class TransportError(ClientError):
    """No answer from the gateway (unreachable, connection lost, timed out)."""


class TlsVerifyError(TransportError):
    """The ``https://`` gateway's certificate does not verify (unknown CA: ``--ca-file``; wrong host name)."""


class GatewayError(ClientError):
    """The gateway answered with an error body ``{"error": {"code", "message", "request_id"}}`` (what the
    gateway raised as an :class:`awp.server.errors.ApiError`, as this client received it)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        request_id: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.retry_after_s = retry_after_s  # the answer's Retry-After header in seconds (a 503 has one)

    @property
    def retryable(self) -> bool:
        return self.status >= 500 or self.status == 429


def retry_after(value: str | None) -> float | None:
    """The seconds of a ``Retry-After`` header given as delay-seconds (an HTTP date or garbage: None)."""
    if value is None or not value.strip().isdigit():
        return None
    return float(min(int(value.strip()), 3600))


def client_ssl_context(ca_file: str | None) -> ssl.SSLContext | bool:
    """The TLS verification of a client: a context trusting ``ca_file`` (PEM; raises OSError or ssl.SSLError
    when it cannot be read), else ``True`` (aiohttp verifies against the system's trust store)."""
    if not ca_file:
        return True
    return ssl.create_default_context(cafile=ca_file)


def _q(part: str) -> str:
    return quote(str(part), safe="")


def body_idempotency_key(body: Any) -> str:
    """A stable Idempotency-Key for a body: the SHA-256 of its canonical JSON."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class Client:
    """One aiohttp session to a gateway. ``base_url`` is ``http(s)://host:port`` (without ``/api/v1``);
    ``ca_file``: the PEM certificate(s) that an ``https://`` gateway's certificate must chain to."""

    def __init__(
        self, base_url: str, token: str | None = None, timeout_s: float = 30.0, ca_file: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/api/v1"):
            self.base_url = self.base_url[: -len("/api/v1")]
        self.token = token
        self.timeout_s = timeout_s
        self.ca_file = ca_file
        self._ssl: ssl.SSLContext | bool = client_ssl_context(ca_file)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=64, ssl=self._ssl),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        root: bool = False,
    ) -> Any:
        """Send one request; return the decoded JSON answer (or text for non-JSON answers)."""
        url = self.base_url + ("" if root else "/api/v1") + path
        hdrs = {"Accept": "application/json"}
        auth = token if token is not None else self.token
        if auth:
            hdrs["Authorization"] = f"Bearer {auth}"
        if headers:
            hdrs.update(headers)
        kwargs: dict[str, Any] = {"headers": hdrs}
        if body is not None:
            kwargs["data"] = json.dumps(body, separators=(",", ":"))
            hdrs["Content-Type"] = "application/json"
        if params:
            kwargs["params"] = {k: str(v) for k, v in params.items() if v is not None}
        if timeout_s is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._get_session().request(method, url, **kwargs) as resp:
                text = await resp.text()
                status = resp.status
                request_id = resp.headers.get("X-Request-Id")
                ctype = resp.headers.get("Content-Type", "")
                wait_s = retry_after(resp.headers.get("Retry-After"))
        except (aiohttp.ClientConnectorCertificateError, ssl.SSLCertVerificationError) as e:
            raise TlsVerifyError(
                f"{method} {url}: the gateway's TLS certificate does not verify ({e}); "
                "give its CA certificate with --ca-file (AWP_CA_FILE)"
            ) from e
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise TransportError(f"{method} {url}: {type(e).__name__}: {e}") from e
        data: Any = text
        if "json" in ctype and text:
            try:
                data = json.loads(text)
            except ValueError:
                data = text
        if status >= 400:
            code, message = "http_" + str(status), text[:500]
            if isinstance(data, dict) and isinstance(data.get("error"), dict):
                err = data["error"]
                code = str(err.get("code") or code)
                message = str(err.get("message") or "")
                request_id = err.get("request_id") or request_id
            raise GatewayError(status, code, message, request_id, wait_s)
        return data

    # ---- worker routes -------------------------------------------------------------------------------

    def _worker_headers(self) -> dict[str, str]:
        return {PROTOCOL_HEADER: str(PROTOCOL_VERSION)}

    async def register_worker(
        self,
        bootstrap_token: str,
        display_name: str,
        executor_kinds: list[str],
        max_concurrency: int,
        actions: dict[str, list[str]] | None = None,
    ) -> dict[str, Any]:
        """``actions``: the actions the worker runs per executor kind (routing by action; a kind not named runs
        every action); not sent when None (an older worker's registration)."""
        body: dict[str, Any] = {
            "display_name": display_name,
            "executor_kinds": executor_kinds,
            "max_concurrency": max_concurrency,
            "protocol_version": PROTOCOL_VERSION,
        }
        if actions is not None:
            body["actions"] = actions
        return await self.request(
            "POST", "/workers/register", body, token=bootstrap_token, headers=self._worker_headers()
        )

    async def claim(
        self, worker_id: str, session_token: str, slots: int, wait_ms: int = 0, claim_seq: int | None = None
    ) -> list[Lease]:
        """The leases of one claim; ``claim_seq`` numbers the request (docs/protocol.md, Lease recovery)."""
        body: dict[str, Any] = {"slots": slots}
        if wait_ms:
            body["wait_ms"] = wait_ms
        if claim_seq is not None:
            body["claim_seq"] = claim_seq
        answer = await self.request(
            "POST",
            f"/workers/{_q(worker_id)}/claims",
            body,
            token=session_token,
            headers=self._worker_headers(),
            timeout_s=self.timeout_s + wait_ms / 1000.0,
        )
        return list(answer.get("leases") or [])

    async def heartbeat(
        self,
        worker_id: str,
        session_token: str,
        leases: list[LeaseRef],
        timeout_s: float | None = None,
        *,
        claimed_through: int | None = None,
        claims_pending: list[int] | None = None,
        dropped: list[LeaseRef] | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """(one answer per lease, the worker's status: ``draining`` once an operator drained it); ``claimed_through``,
        ``claims_pending`` and ``dropped`` are the lease recovery fields (docs/protocol.md, Lease recovery), sent
        when given."""
        body: dict[str, Any] = {"leases": leases}
        if claimed_through is not None:
            body["claimed_through"] = claimed_through
            body["claims_pending"] = list(claims_pending or [])
        if dropped:
            body["dropped"] = dropped
        answer = await self.request(
            "POST",
            f"/workers/{_q(worker_id)}/heartbeat",
            body,
            token=session_token,
            headers=self._worker_headers(),
            timeout_s=timeout_s,
        )
        status = answer.get("worker_status")
        return list(answer.get("leases") or []), status if isinstance(status, str) else None

    async def complete(
        self,
        worker_id: str,
        session_token: str,
        dispatch_id: str,
        lease_token: str,
        result: Result,
        claim_slots: int | None = None,
        claim_seq: int | None = None,
        live_output: list[OutputWrite] | None = None,
    ) -> tuple[bool, list[Lease]]:
        """(applied, new leases); with ``claim_slots`` the gateway also claims that many in the same call
        (``claim_seq`` numbering that claim); ``live_output``: the lease's last progress writes (docs/progress.md),
        written before the result."""
        body: dict[str, Any] = {"lease_token": lease_token, "result": result}
        if live_output:
            body["live_output"] = live_output
        if claim_slots is not None:
            body["claim_slots"] = claim_slots
        if claim_seq is not None:
            body["claim_seq"] = claim_seq
        answer = await self.request(
            "POST",
            f"/workers/{_q(worker_id)}/leases/{_q(dispatch_id)}/complete",
            body,
            token=session_token,
            headers=self._worker_headers(),
        )
        return bool(answer.get("applied")), list(answer.get("leases") or [])

    async def complete_many(
        self,
        worker_id: str,
        session_token: str,
        items: list[Completion],
        claim_slots: int = 0,
        claim_seq: int | None = None,
    ) -> tuple[list[dict[str, Any]], list[Lease]]:
        """(per-result answers in the order given, new leases): ``items`` are {dispatch_id, lease_token, result};
        each answer is {dispatch_id, applied: true} or {dispatch_id, error: {code, message}}."""
        body: dict[str, Any] = {"results": items}
        if claim_slots:
            body["claim_slots"] = claim_slots
            if claim_seq is not None:
                body["claim_seq"] = claim_seq
        answer = await self.request(
            "POST", f"/workers/{_q(worker_id)}/completions", body, token=session_token, headers=self._worker_headers()
        )
        return list(answer.get("results") or []), list(answer.get("leases") or [])

    async def report_progress(
        self,
        worker_id: str,
        session_token: str,
        dispatch_id: str,
        lease_token: str,
        progress: Any = None,
        logs: list[str] | None = None,
        chunks: list[str] | None = None,
        *,
        with_progress: bool = False,
    ) -> dict[str, Any]:
        """POST .../leases/{dispatch_id}/progress (docs/progress.md): {"seq", "truncated"}. ``progress`` is sent
        when not None, or when ``with_progress`` (to send a JSON null)."""
        body: dict[str, Any] = {"lease_token": lease_token}
        if progress is not None or with_progress:
            body["progress"] = progress
        if logs is not None:
            body["logs"] = logs
        if chunks is not None:
            body["chunks"] = chunks
        path = f"/workers/{_q(worker_id)}/leases/{_q(dispatch_id)}/progress"
        return await self.request("POST", path, body, token=session_token, headers=self._worker_headers())

    async def report_progress_many(
        self, worker_id: str, session_token: str, items: list[ProgressItem]
    ) -> list[dict[str, Any]]:
        """POST /workers/{id}/progress: several leases' writes; per item {dispatch_id, seq, truncated} or
        {dispatch_id, error: {code, message}}, in order."""
        answer = await self.request(
            "POST",
            f"/workers/{_q(worker_id)}/progress",
            {"items": items},
            token=session_token,
            headers=self._worker_headers(),
        )
        return list(answer.get("items") or [])

    async def task_logs(
        self, run_id: str, task_key: str, after: int = 0, attempt: int | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        """GET /runs/{id}/tasks/{key}/logs (docs/progress.md)."""
        params: dict[str, Any] = {"after": after}
        if attempt is not None:
            params["attempt"] = attempt
        if limit is not None:
            params["limit"] = limit
        return await self.request("GET", f"/runs/{_q(run_id)}/tasks/{_q(task_key)}/logs", params=params)

    async def drain(self, worker_id: str, session_token: str) -> dict[str, Any]:
        return await self.request(
            "POST", f"/workers/{_q(worker_id)}/drain", {}, token=session_token, headers=self._worker_headers()
        )

    async def release(self, worker_id: str, session_token: str, dispatch_id: str, lease_token: str) -> dict[str, Any]:
        """Give back a lease this worker cannot finish (docs/protocol.md, Drain): its task is due again at once."""
        return await self.request(
            "POST",
            f"/workers/{_q(worker_id)}/leases/{_q(dispatch_id)}/release",
            {"lease_token": lease_token, "reason": "worker_shutdown"},
            token=session_token,
            headers=self._worker_headers(),
        )

    async def drain_worker(self, worker_id: str) -> dict[str, Any]:
        """An operator's drain (the operator token): the worker drains at its next heartbeat."""
        return await self.request("POST", f"/workers/{_q(worker_id)}/drain", {})

    # ---- people routes (viewer / operator token) -----------------------------------------------------------

    async def apply_workflow(self, definition: dict[str, Any]) -> dict[str, Any]:
        key = body_idempotency_key(definition)
        return await self.request("POST", "/workflows", definition, headers={"Idempotency-Key": key})

    async def get_workflow(self, workflow_id: str) -> dict[str, Any]:
        return await self.request("GET", f"/workflows/{_q(workflow_id)}")

    async def list_workflows(self) -> list[dict[str, Any]]:
        return [item async for item in self._pages("/workflows")]

    async def start_run(
        self,
        workflow_id: str,
        version: int | None = None,
        idempotency_key: str | None = None,
        input: dict[str, Any] | None = None,
        priority: int | None = None,
    ) -> dict[str, Any]:
        """Start a run (of the latest version when ``version`` is None); the body holds ``input`` and ``priority``
        (docs/limits.md, Priority) when given, else it is ``{}``."""
        if version is None:
            wf = await self.get_workflow(workflow_id)
            version = int(wf.get("latest_version") or wf["version"])
        body: dict[str, Any] = {"input": input} if input is not None else {}
        if priority is not None:
            body["priority"] = priority
        return await self.request(
            "POST",
            f"/workflows/{_q(workflow_id)}/versions/{int(version)}/runs",
            body,
            headers={"Idempotency-Key": idempotency_key or str(uuid.uuid4())},
        )

    async def get_run(self, run_id: str) -> dict[str, Any]:
        return await self.request("GET", f"/runs/{_q(run_id)}")

    async def list_runs(
        self, workflow_id: str | None = None, status: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Runs, newest first (at most ``limit``: the pages after it are not read)."""
        items: list[dict[str, Any]] = []
        async for item in self._pages("/runs", {"workflow_id": workflow_id, "status": status}):
            items.append(item)
            if limit is not None and len(items) >= limit:
                break
        return items

    async def workflow_versions(self, workflow_id: str) -> list[dict[str, Any]]:
        return [item async for item in self._pages(f"/workflows/{_q(workflow_id)}/versions")]

    async def get_workflow_version(self, workflow_id: str, version: int) -> dict[str, Any]:
        return await self.request("GET", f"/workflows/{_q(workflow_id)}/versions/{int(version)}")

    async def run_tasks(self, run_id: str) -> list[dict[str, Any]]:
        return [item async for item in self._pages(f"/runs/{_q(run_id)}/tasks")]

    async def get_task(self, run_id: str, task_key: str) -> dict[str, Any]:
        return await self.request("GET", f"/runs/{_q(run_id)}/tasks/{_q(task_key)}")

    async def run_events(self, run_id: str, after_sequence: int = 0) -> list[dict[str, Any]]:
        params = {"after": after_sequence} if after_sequence else None
        return [item async for item in self._pages(f"/runs/{_q(run_id)}/events", params)]

    async def send_signal(
        self, run_id: str, task_key: str, payload: dict[str, Any], idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """The signal a task of executor signal waits for (docs/waits.md)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return await self.request(
            "POST", f"/runs/{_q(run_id)}/tasks/{_q(task_key)}/signal", {"payload": payload}, headers=headers
        )

    async def retry_run(
        self, run_id: str, task_keys: list[str] | None = None, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Re-run a failed or canceled run (its failed tasks, or ``task_keys`` and what depends on them)."""
        body = {"task_keys": task_keys} if task_keys else {}
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return await self.request("POST", f"/runs/{_q(run_id)}/retry", body, headers=headers)

    async def cancel_run(self, run_id: str) -> dict[str, Any]:
        return await self.request("POST", f"/runs/{_q(run_id)}/cancel", {})

    async def create_schedule(
        self,
        schedule_id: str,
        workflow_id: str,
        *,
        cron: str | None = None,
        interval_ms: int | None = None,
        input: dict[str, Any] | None = None,
        timezone: str | None = None,
    ) -> dict[str, Any]:
        """Create a schedule (exactly one of ``cron`` and ``interval_ms``); the same definition again returns it."""
        body: dict[str, Any] = {"schedule_id": schedule_id, "workflow_id": workflow_id}
        optional = {"cron": cron, "interval_ms": interval_ms, "input": input, "timezone": timezone}
        body.update({k: v for k, v in optional.items() if v is not None})
        return await self.request("POST", "/schedules", body)

    async def list_schedules(self) -> list[dict[str, Any]]:
        return [item async for item in self._pages("/schedules")]

    async def delete_schedule(self, schedule_id: str) -> dict[str, Any]:
        return await self.request("DELETE", f"/schedules/{_q(schedule_id)}")

    async def set_limit(
        self,
        name: str,
        *,
        max_in_flight: int | None = None,
        per_window: int | None = None,
        window_ms: int | None = None,
    ) -> dict[str, Any]:
        """Define or replace a named rate limit (docs/limits.md)."""
        body = {"max_in_flight": max_in_flight, "per_window": per_window, "window_ms": window_ms}
        return await self.request("PUT", f"/limits/{_q(name)}", {k: v for k, v in body.items() if v is not None})

    async def list_limits(self) -> list[dict[str, Any]]:
        return list((await self.request("GET", "/limits"))["items"])

    async def delete_limit(self, name: str) -> dict[str, Any]:
        return await self.request("DELETE", f"/limits/{_q(name)}")

    async def list_workers(self) -> list[dict[str, Any]]:
        return [item async for item in self._pages("/workers")]

    async def get_worker(self, worker_id: str) -> dict[str, Any]:
        return await self.request("GET", f"/workers/{_q(worker_id)}")

    async def cluster_status(self) -> dict[str, Any]:
        """``GET /status``: workers and slots by executor kind, live dispatches, the oldest waiting task and why."""
        return await self.request("GET", "/status")

    async def _pages(self, path: str, params: dict[str, Any] | None = None) -> AsyncIterator[dict[str, Any]]:
        """Every item of a list route, following ``next_cursor`` (pages of 100, the most a route gives)."""
        query = {"limit": 100, **{k: v for k, v in (params or {}).items() if v is not None}}
        seen: set[str] = set()
        while True:
            answer = await self.request("GET", path, params=query)
            if isinstance(answer, list):
                for item in answer:
                    yield item
                return
            for item in answer.get("items") or []:
                yield item
            cursor = answer.get("next_cursor")
            if not cursor or cursor in seen:
                return
            seen.add(cursor)
            query["cursor"] = cursor


async def wait_ready(base_url: str, timeout_s: float = 30.0, ca_file: str | None = None) -> None:
    """Wait until ``GET /health/ready`` answers 200; raises TimeoutError."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    async with Client(base_url, timeout_s=2.0, ca_file=ca_file) as client:
        while True:
            try:
                await client.request("GET", "/health/ready", root=True)
                return
            except ClientError:
                if loop.time() > end:
                    raise TimeoutError(f"gateway {base_url} not ready after {timeout_s:.0f}s") from None
                await asyncio.sleep(0.1)
