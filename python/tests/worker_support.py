"""Real ``awp worker`` processes for tests, and small HTTP helpers to drive runs through a gateway.

with serve(db_dsn) as gw, Workers(gw) as workers:
    w = workers.start("w1", executors="mock,python")
    run_id = start_run(gw, apply(gw, definition))
    assert wait_run(gw, run_id)["status"] == "succeeded"
    w.wait_log("completed")
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql

from awp.dev import procs
from awp_testing.gateway import ServeProcess, wait_until

REPO = Path(__file__).resolve().parents[2]
TERMINAL = ("succeeded", "failed", "canceled")


class WorkerProcess:
    def __init__(self, name: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name = name
        self.proc = proc
        self.log_path = log_path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_log(self, text: str, timeout: float = 10.0) -> str:
        try:
            return wait_until(lambda: text in self.log(), timeout, 0.05, f"{text!r} in the log of {self.name}")
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n--- {self.name} log ---\n{self.log()[-4000:]}") from None

    def wait_exit(self, timeout: float = 15.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.name} still running after {timeout}s\n{self.log()[-4000:]}") from None

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def kill(self) -> None:
        procs.kill(self.proc)


class Workers:
    """Starts workers against a gateway; every one still alive is killed on exit."""

    def __init__(self, gw: ServeProcess | None, gateway_url: str | None = None, bootstrap: str | None = None) -> None:
        self.gateway_url = gateway_url or (gw.base_url if gw else "")
        self.bootstrap = bootstrap or (gw.tokens.bootstrap if gw else "")
        self.procs: list[WorkerProcess] = []

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for w in self.procs:  # kill them all first: reporting below may fail (e.g. a closed stderr)
            w.kill()
        for w in self.procs:
            if exc[0] is not None:
                with contextlib.suppress(OSError):
                    sys.stderr.write(f"--- {w.name} log ---\n{w.log()[-3000:]}\n")
            w.log_path.unlink(missing_ok=True)

    def start(
        self,
        name: str,
        *,
        executors: str = "mock",
        concurrency: int = 2,
        safety_margin_ms: int = 300,
        wait_ms: int = 2000,
        shutdown_timeout: float = 10.0,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        fd, log_name = tempfile.mkstemp(prefix=f"awp-worker-{name}-", suffix=".log")
        os.close(fd)
        full_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AWP_")},
            "AWP_GATEWAY_URL": self.gateway_url,
            "AWP_WORKER_BOOTSTRAP_TOKEN": self.bootstrap,
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        args = [
            "worker",
            "--name",
            name,
            "--executor",
            executors,
            "--concurrency",
            str(concurrency),
            "--safety-margin-ms",
            str(safety_margin_ms),
            "--wait-ms",
            str(wait_ms),
            "--shutdown-timeout",
            str(shutdown_timeout),
            *(extra or []),
        ]
        proc = procs.start(args, env=full_env, cwd=REPO, log_path=Path(log_name))
        w = WorkerProcess(name, proc, Path(log_name))
        self.procs.append(w)
        return w


# ---- HTTP helpers ------------------------------------------------------------------------------------------


def drained_workers(gw: ServeProcess) -> Iterator[Workers]:
    """Workers for one test (a pytest fixture body): on the way out every one is drained with SIGTERM, so the
    next test of the module starts with no lease held."""
    with Workers(gw) as ws:
        yield ws
        for w in ws.procs:
            w.signal(signal.SIGTERM)
        for w in ws.procs:
            w.wait_exit(15)


def api(gw: ServeProcess, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    r = httpx.request(method, gw.api(path), json=body, headers={**gw.auth("operator"), **(headers or {})}, timeout=10.0)
    assert r.status_code < 400, f"{method} {path}: {r.status_code} {r.text}"
    return r.json()


def apply(gw: ServeProcess, definition: dict[str, Any]) -> tuple[str, int]:
    answer = api(gw, "POST", "/workflows", definition, {"Idempotency-Key": f"k-{time.monotonic_ns()}"})
    return answer["workflow_id"], answer["version"]


def start_run(gw: ServeProcess, workflow: tuple[str, int]) -> str:
    wf, version = workflow
    answer = api(
        gw, "POST", f"/workflows/{wf}/versions/{version}/runs", {}, {"Idempotency-Key": f"r-{time.monotonic_ns()}"}
    )
    return answer["run_id"]


def get_run(gw: ServeProcess, run_id: str) -> dict[str, Any]:
    return api(gw, "GET", f"/runs/{run_id}")


def all_items(gw: ServeProcess, path: str) -> list[dict[str, Any]]:
    """Every item of a list route, following next_cursor (pages of 100)."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        sep = "&" if "?" in path else "?"
        page = api(gw, "GET", f"{path}{sep}limit=100" + (f"&cursor={cursor}" if cursor else ""))
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items


def tasks(gw: ServeProcess, run_id: str) -> dict[str, dict[str, Any]]:
    return {t["task_key"]: t for t in all_items(gw, f"/runs/{run_id}/tasks")}


def task(gw: ServeProcess, run_id: str, key: str) -> dict[str, Any]:
    return api(gw, "GET", f"/runs/{run_id}/tasks/{key}")


def wait_run(gw: ServeProcess, run_id: str, timeout: float = 30.0) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        run = get_run(gw, run_id)
        return run if run["status"] in TERMINAL else None

    return wait_until(done, timeout, 0.1, f"run {run_id} to end")


def wait_task_status(gw: ServeProcess, run_id: str, key: str, status: str, timeout: float = 15.0) -> dict[str, Any]:
    return wait_until(
        lambda: (t := tasks(gw, run_id)[key])["status"] == status and t,
        timeout,
        0.05,
        f"task {key} to be {status}",
    )


# Short leases and heartbeats (awp.configure), so that workers notice a change (a drain, a new lease) within a
# fraction of a second: the GATEWAY_SETTINGS of many modules (conftest.py, fixture gw).
SHORT_LEASES = {"lease_duration_ms": 3000, "heartbeat_interval_ms": 300}


def set_settings(dsn: str, **settings: int) -> None:
    """``awp.configure(name => value, ...)`` on ``dsn``; the settings not named keep their values."""
    named = sql.SQL(", ").join(sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder()) for k in settings)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("SELECT awp.configure({})").format(named), list(settings.values()))


def python_task(key: str, action: str, max_attempts: int = 1, **inp: Any) -> dict[str, Any]:
    """A task of the python executor running ``action`` with input ``inp`` (max_attempts 1 by default: a task that
    goes to a wrong worker, or loses an attempt, fails its run)."""
    return {
        "key": key,
        "executor": "python",
        "action": action,
        "input": inp,
        "retry": {"max_attempts": max_attempts, "interval_ms": 0},
        "timeout_ms": 120000,
    }


def mock_task(key: str, deps: list[str] | None = None, max_attempts: int = 1, **inp: Any) -> dict[str, Any]:
    return {
        "key": key,
        "executor": "mock",
        "action": key,
        "input": inp,
        "depends_on": deps or [],
        "retry": {"max_attempts": max_attempts, "interval_ms": 0},
        "timeout_ms": 60000,
    }


class TcpProxy:
    """A TCP forwarder from a local port to ``upstream_port``: ``cut()`` drops every connection and refuses
    new ones (a network partition), ``restore()`` listens again on the same port."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.restore()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            if self._listener is not None:
                with contextlib.suppress(OSError):
                    self._listener.shutdown(socket.SHUT_RDWR)
                self._listener.close()
                self._listener = None
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._conns.clear()

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


class RecordingProxy:
    """An HTTP forwarder to a gateway that keeps every exchange (``exchanges``: method, path, status, request
    and response JSON), so a test can see what a real worker sent and received (its lease tokens, its
    completions) without any change to the worker."""

    def __init__(self, upstream: str) -> None:
        import http.server  # local: only this helper needs it

        self.upstream = upstream.rstrip("/")
        self.exchanges: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                keep = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")
                }
                try:
                    with httpx.Client(timeout=60) as client:
                        r = client.request(self.command, proxy.upstream + self.path, content=body, headers=keep)
                    status, data, ctype = r.status_code, r.content, r.headers.get("content-type", "application/json")
                except httpx.HTTPError:
                    status, data, ctype = 502, b'{"error": {"code": "proxy"}}', "application/json"
                proxy._record(self.command, self.path, status, body, data)
                if proxy.drop_answer(self.path, status, data):  # as if the gateway died right after its commit
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                with contextlib.suppress(OSError):  # the worker hung up (a long poll ended by its shutdown)
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True, name="recording-proxy").start()

    def drop_answer(self, path: str, status: int, response: bytes) -> bool:
        """Whether to close the connection instead of forwarding this answer (never, here; see subclasses)."""
        return False

    def _record(self, method: str, path: str, status: int, request: bytes, response: bytes) -> None:
        def parse(raw: bytes) -> Any:
            try:
                return json.loads(raw) if raw else None
            except ValueError:
                return None

        with self._lock:
            self.exchanges.append(
                {
                    "method": method,
                    "path": path,
                    "status": status,
                    "request": parse(request),
                    "response": parse(response),
                }
            )

    def find(self, suffix: str) -> list[dict[str, Any]]:
        """The exchanges whose path ends with ``suffix`` (e.g. ``/claims``), in order."""
        with self._lock:
            return [x for x in self.exchanges if x["path"].split("?")[0].endswith(suffix)]

    def leases(self) -> list[dict[str, Any]]:
        """Every lease the gateway handed out through this proxy (claims and completions that claimed)."""
        found: list[dict[str, Any]] = []
        with self._lock:
            for x in self.exchanges:
                path = x["path"].split("?")[0]
                if (
                    x["status"] == 200
                    and path.endswith(("/claims", "/complete", "/completions"))
                    and isinstance(x["response"], dict)
                ):
                    found.extend(x["response"].get("leases") or [])
        return found

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
