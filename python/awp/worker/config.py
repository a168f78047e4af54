"""What a worker is told (:class:`WorkerConfig`) and how it ends: its exit codes, :class:`Fatal` and
:class:`SessionInvalid` (docs/protocol.md, The worker).

Exit codes: 0 after a drain (SIGTERM/SIGINT), 2 for a rejected bootstrap token or bad configuration,
3 when the session became invalid (``worker_session_invalid``), 4 when a drain ended with handlers still running
that could not be stopped (hung sync handlers: a supervisor should restart the worker), 130 on a second signal."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_SESSION = 3
EXIT_HUNG = 4
EXIT_SIGNAL = 130

SESSION_INVALID = "worker_session_invalid"  # the error code of a session the gateway no longer accepts


class SessionInvalid(Exception):
    """The gateway no longer accepts this worker session: the process must exit and register anew."""


class Fatal(Exception):
    """Why the worker exits, and with which code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class WorkerConfig:
    gateway: str
    bootstrap_token: str
    executors: list[str] = field(default_factory=lambda: ["mock"])
    concurrency: int = 4
    handler_modules: list[str] = field(default_factory=list)
    name: str = ""
    shutdown_timeout_s: float = 30.0
    safety_margin_ms: int = 1000
    wait_ms: int = 20000
    backoff_min_ms: int = 100
    backoff_max_ms: int = 5000
    claim_on_complete: bool = True  # ask for the next lease with each completion (one round trip per task)
    batch: bool = True  # with concurrency > 1: send the results that are ready together (one request for many)
    ca_file: str | None = None  # PEM CA certificate(s) an https:// gateway's certificate must chain to

    def __post_init__(self) -> None:
        if not self.name:
            self.name = f"{socket.gethostname()}-{os.getpid()}"

    @property
    def batching(self) -> bool:
        """Whether results go to the completer's queue, many per request (``POST .../completions``)."""
        return self.batch and self.concurrency > 1
