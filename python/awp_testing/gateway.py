"""Run a real ``awp serve`` process from a test or a benchmark (gateway, worker and crash tests, gateway_rps).

    from awp_testing.gateway import Tokens, serve

    with serve(db_dsn) as gw:                      # started, /health/ready answered 200
        r = httpx.get(gw.url("/api/v1/runs"), headers=gw.auth("viewer"))
        gw.kill()                                  # kill -9 (or gw.stop() for SIGTERM)

- :func:`start_serve` starts one process on a free port and waits until ``/health/ready`` is 200 (or, with
  ``wait_ready=False``, until ``/health/live`` is); :func:`serve` is the same as a context manager that
  stops the process on exit.
- :class:`Tokens` holds the three secrets (random per process unless given); ``gw.auth(role)`` gives the
  Authorization header for ``"viewer"``, ``"operator"`` or ``"bootstrap"``, and :func:`bearer` for any token.
- The process's output goes to ``gw.log_path``; ``gw.log_tail()`` is included in start-up failures.
- Repeated 401s are not delayed (``AWP_AUTH_BACKOFF_MAX_MS=0``) unless ``env`` says otherwise.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import ssl
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from awp.dev import procs
from awp.dev.localdb import free_port
from awp_testing import pgbouncer

PROTOCOL = {"X-Worker-Protocol-Version": "1"}


@dataclass(frozen=True)
class Tokens:
    viewer: str = field(default_factory=lambda: "viewer-" + secrets.token_urlsafe(32))
    operator: str = field(default_factory=lambda: "operator-" + secrets.token_urlsafe(32))
    bootstrap: str = field(default_factory=lambda: "bootstrap-" + secrets.token_urlsafe(32))

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
    return procs.wait_for(predicate, timeout, what or str(predicate), interval)


@dataclass
class ServeProcess:
    """One running ``awp serve``."""

    proc: subprocess.Popen[bytes]
    port: int
    tokens: Tokens
    log_path: Path
    host: str = "127.0.0.1"
    ca_file: str | None = None  # set when it serves HTTPS (--tls-cert): the CA its certificate chains to

    @property
    def base_url(self) -> str:
        return f"{'https' if self.ca_file else 'http'}://{self.host}:{self.port}"

    def verify(self) -> ssl.SSLContext | bool:
        """httpx's ``verify=`` for this gateway: a context trusting ``ca_file`` when it serves HTTPS."""
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True

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
        return procs.log_tail(self.log_path, lines)

    def health(self, path: str = "/health/ready", timeout: float = 2.0) -> httpx.Response | None:
        try:
            return httpx.get(self.url(path), timeout=timeout, verify=self.verify())
        except httpx.HTTPError:
            return None

    def live(self) -> bool:
        """/health/live answers (with any status)."""
        return self.health("/health/live") is not None

    def ready(self) -> dict[str, Any] | None:
        """The /health/ready JSON when it answers 200, else None."""
        r = self.health()
        return r.json() if r is not None and r.status_code == 200 else None

    def wait_ready(self, timeout: float = 20.0) -> dict[str, Any]:
        return procs.wait_ready(self.proc, self.ready, timeout=timeout, what="awp serve", log_path=self.log_path)

    def coordinator_active(self) -> bool:
        state = self.ready()
        return bool(state and state.get("coordinator_active"))

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait (kill -9 after ``timeout``); returns the exit code."""
        return procs.stop(self.proc, timeout)

    def kill(self) -> int:
        """kill -9 and reap."""
        return procs.kill(self.proc)


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
    ca_file: str | None = None,
) -> ServeProcess:
    """Start ``awp serve`` against ``dsn`` on ``port`` (default: a free one; give the old port to restart a
    gateway its workers already know); extra CLI ``args`` and ``env`` are passed on. ``ca_file``: it serves
    HTTPS (give ``--tls-cert``/``--tls-key`` in ``args``) with a certificate of that CA."""
    tokens = tokens or Tokens()
    port = port or free_port()
    log_fd, log_name = tempfile.mkstemp(prefix=f"awp-serve-{port}-", suffix=".log")
    os.close(log_fd)
    log_path = Path(log_name)
    full_env = {
        **os.environ,
        **tokens.env(),
        "AWP_DATABASE_URL": dsn,
        "AWP_COORDINATOR_INTERVAL_MS": str(coordinator_interval_ms),
        "PYTHONUNBUFFERED": "1",
        # No delay of repeated 401s: tests of the auth matrix and hostile input send hundreds from one address.
        # python/tests/integration/test_auth_backoff.py turns it on.
        "AWP_AUTH_BACKOFF_MAX_MS": "0",
        **_through_pgbouncer(dsn),
        **(env or {}),  # a test that points the gateway at a PgBouncer of its own wins
    }
    proc = procs.start(["serve", "--host", "127.0.0.1", "--port", str(port), *args], env=full_env, log_path=log_path)
    gw = ServeProcess(proc=proc, port=port, tokens=tokens, log_path=log_path, ca_file=ca_file)
    try:
        if wait_ready:
            gw.wait_ready(timeout)
        else:
            procs.wait_ready(proc, gw.live, timeout=timeout, what="awp serve (live)", log_path=log_path)
    except BaseException:
        gw.kill()
        raise
    return gw


def _through_pgbouncer(dsn: str) -> dict[str, str]:
    """While ``make pgbouncer-test`` runs (awp_testing.pgbouncer): the gateway's requests go through PgBouncer,
    its coordinator and LISTEN connection straight to the server."""
    port = pgbouncer.fronts(dsn)
    if port is None:
        return {}
    return {
        "AWP_DATABASE_URL": pgbouncer.pooled_dsn(dsn, port),
        "AWP_DIRECT_DATABASE_URL": dsn,
        "AWP_PGBOUNCER": "1",
    }


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
