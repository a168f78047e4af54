"""How a worker waits before trying a request again: :class:`Backoff`, the gateway's Retry-After, and which
failures are outages (a result is kept through those, docs/protocol.md, Lease recovery)."""

from __future__ import annotations

import random

from awp.worker.client import ClientError, GatewayError, TlsVerifyError, TransportError


class Backoff:
    """Exponential backoff with full jitter: sleep uniform(0, min(max, min * 2**n)); when the gateway said how long
    to wait (a 503's Retry-After), at least about that long (0.5-1 times it, jittered, at most 5 s)."""

    def __init__(self, min_ms: int, max_ms: int) -> None:
        self.min_s = max(min_ms, 1) / 1000.0
        self.max_s = max(max_ms, min_ms) / 1000.0
        self.failures = 0

    def reset(self) -> None:
        self.failures = 0

    def next_delay(self, retry_after_s: float | None = None) -> float:
        cap = min(self.max_s, self.min_s * (2**self.failures))
        self.failures = min(self.failures + 1, 30)
        delay = random.uniform(0, cap)
        if retry_after_s:
            delay = max(delay, random.uniform(0.5, 1.0) * min(retry_after_s, 5.0))
        return delay


def retry_after_of(error: BaseException) -> float | None:
    """The Retry-After (seconds) of a gateway's error answer, if it gave one."""
    return error.retry_after_s if isinstance(error, GatewayError) else None


def is_outage(error: ClientError) -> bool:
    """Whether a request failed because the gateway or the database is unreachable (no answer, 502/503/504):
    a result is kept and sent again after such a failure, never dropped for it (docs/protocol.md, Lease recovery)."""
    if isinstance(error, TransportError):
        return not isinstance(error, TlsVerifyError)  # a certificate that does not verify is no outage
    return isinstance(error, GatewayError) and error.status in (502, 503, 504)
