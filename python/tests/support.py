"""Run a real ``awp serve`` process from a test (gateway, worker and crash tests share this).

    from support import Tokens, serve

    with serve(db_dsn) as gw:                      # started, /health/ready answered 200
        r = httpx.get(gw.url("/api/v1/runs"), headers=gw.auth("viewer"))
        gw.kill()                                  # kill -9 (or gw.stop() for SIGTERM)

- :func:`start_serve` starts one process on a free port and waits until ``/health/ready`` is 200 (or, with
  ``wait_ready=False``, until ``/health/live`` is); :func:`serve` is the same as a context manager that
  stops the process on exit.
- :class:`Tokens` holds the three secrets (random per process unless given); ``gw.auth(role)`` gives the
  Authorization header for ``"viewer"``, ``"operator"`` or ``"bootstrap"``, and :func:`bearer` for any token.
- The process's output goes to ``gw.log_path``; ``gw.log_tail()`` is included in start-up failures.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from awp.localdb import free_port

PROTOCOL = {"X-Worker-Protocol-Version": "1"}


@dataclass(frozen=True)
class Tokens:
    viewer: str = field(default_factory=lambda: "viewer-" + secrets.token_urlsafe(16))
    operator: str = field(default_factory=lambda: "operator-" + secrets.token_urlsafe(16))
    bootstrap: str = field(default_factory=lambda: "bootstrap-" + secrets.token_urlsafe(16))

    def env(self) -> dict[str, str]:
        return {
            "AWP_VIEWER_TOKEN": self.viewer,
            "AWP_OPERATOR_TOKEN": self.operator,
            "AWP_WORKER_BOOTSTRAP_TOKEN": self.bootstrap,
        }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


@dataclass
class ServeProcess:
    """One running ``awp serve``."""

    proc: subprocess.Popen[bytes]
    port: int
    tokens: Tokens
    log_path: Path
    host: str = "127.0.0.1"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def api(self, path: str) -> str:
        return self.base_url + "/api/v1" + path

    def auth(self, role: str) -> dict[str, str]:
        return bearer(getattr(self.tokens, role))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def health(self, path: str = "/health/ready", timeout: float = 2.0) -> httpx.Response | None:
        try:
            return httpx.get(self.url(path), timeout=timeout)
        except httpx.HTTPError:
            return None

    def ready(self) -> dict[str, Any] | None:
        """The /health/ready JSON when it answers 200, else None."""
        r = self.health()
        return r.json() if r is not None and r.status_code == 200 else None

    def wait_ready(self, timeout: float = 20.0) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            if not self.alive():
                raise RuntimeError(f"awp serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            return self.ready()

        try:
            return wait_until(check, timeout, 0.05, "awp serve to be ready")
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{self.log_tail()}") from None

    def coordinator_active(self) -> bool:
        state = self.ready()
        return bool(state and state.get("coordinator_active"))

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait (kill -9 after ``timeout``); returns the exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def kill(self) -> int:
        """kill -9 and reap."""
        if self.alive():
            self.proc.kill()
        return self.proc.wait()


def start_serve(
    dsn: str,
    *,
    tokens: Tokens | None = None,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    coordinator_interval_ms: int = 100,
    wait_ready: bool = True,
    timeout: float = 20.0,
    port: int | None = None,
) -> ServeProcess:
    """Start ``awp serve`` against ``dsn`` on ``port`` (default: a free one; give the old port to restart a
    gateway its workers already know); extra CLI ``args`` and ``env`` are passed on."""
    tokens = tokens or Tokens()
    port = port or free_port()
    log_fd, log_name = tempfile.mkstemp(prefix=f"awp-serve-{port}-", suffix=".log")
    full_env = {
        **os.environ,
        **tokens.env(),
        "AWP_DATABASE_URL": dsn,
        "AWP_COORDINATOR_INTERVAL_MS": str(coordinator_interval_ms),
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    cmd = [
        sys.executable,
        "-c",
        "from awp.cli import main; main()",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    with os.fdopen(log_fd, "wb") as log_file:
        proc = subprocess.Popen(cmd, env=full_env, stdout=log_file, stderr=subprocess.STDOUT)
    gw = ServeProcess(proc=proc, port=port, tokens=tokens, log_path=Path(log_name))
    try:
        if wait_ready:
            gw.wait_ready(timeout)
        else:
            wait_until(
                lambda: (gw.alive() or _raise_exited(gw)) and gw.health("/health/live") is not None,
                timeout,
                0.05,
                "awp serve to be live",
            )
    except BaseException:
        gw.kill()
        raise
    return gw


def _raise_exited(gw: ServeProcess) -> bool:
    raise RuntimeError(f"awp serve exited with {gw.proc.returncode}:\n{gw.log_tail()}")


@contextlib.contextmanager
def serve(dsn: str, **kwargs: Any) -> Iterator[ServeProcess]:
    """:func:`start_serve` as a context manager: SIGTERM (then kill -9) on exit."""
    gw = start_serve(dsn, **kwargs)
    try:
        yield gw
    finally:
        gw.stop()
        with contextlib.suppress(OSError):
            gw.log_path.unlink()
