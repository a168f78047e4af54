"""What every part of the HTTP gateway shares: :class:`GatewayConfig` (everything ``awp serve`` passes to the
app), the typed keys of what the application holds, and the worker protocol header."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from awp.coordinator import Coordinator
from awp.db import Database, DispatchListener
from awp.metrics import Metrics

API = "/api/v1"
PROTOCOL_HEADER = "X-Worker-Protocol-Version"
PROTOCOL_VERSION = "1"


@dataclass(frozen=True)
class GatewayConfig:
    """Everything ``awp serve`` passes to the app."""

    database_url: str
    viewer_token: str
    operator_token: str
    bootstrap_token: str
    metrics_token: str | None = None
    pool_size: int = 10
    coordinator: bool = True
    coordinator_interval_ms: int = 1000
    claim_recheck_ms: int = 500
    retention_interval_ms: int | None = 5000  # background retention batches (None: off); docs/retention.md

    def check(self) -> None:
        """Raise ValueError when a secret is empty or two secrets are equal."""
        secrets = {
            "viewer": self.viewer_token,
            "operator": self.operator_token,
            "worker bootstrap": self.bootstrap_token,
        }
        for name, value in secrets.items():
            if not value or not value.strip():
                raise ValueError(f"the {name} token is empty")
        if len(set(secrets.values())) != len(secrets):
            raise ValueError("the viewer, operator and worker bootstrap tokens must all differ")
        if self.metrics_token is not None and not self.metrics_token.strip():
            raise ValueError("the metrics token is empty")
        if self.coordinator_interval_ms < 10:
            raise ValueError("the coordinator interval must be at least 10 ms")
        if self.retention_interval_ms is not None and self.retention_interval_ms < 100:
            raise ValueError("the retention interval must be at least 100 ms")


CONFIG = web.AppKey("config", GatewayConfig)
DB = web.AppKey("db", Database)
LISTENER = web.AppKey("listener", DispatchListener)
METRICS = web.AppKey("metrics", Metrics)
COORDINATOR = web.AppKey("coordinator", Coordinator)
OPENAPI = web.AppKey("openapi", bytes)
