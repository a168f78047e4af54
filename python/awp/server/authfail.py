"""Failed authentication (a 401 answer): a per-source back-off and a rate-limited log (docs/operations.md,
Secrets).

A source is the peer address of the connection (an IPv6 address by its /64, which one host usually holds
whole); ``X-Forwarded-For`` is not trusted. Its first :data:`FREE_FAILURES` failures of a
:data:`WINDOW_S`-second window are answered at once; each later one is answered after a delay doubling from
:data:`FIRST_DELAY_S` up to the cap (``awp serve --auth-backoff-max-ms``). Only failed answers wait: a correct
token is never delayed, and other sources are not affected. The table holds at most :data:`MAX_SOURCES`
sources, the least recently failed dropped first.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable

from awp.logsafe import escape_controls

log = logging.getLogger("awp.gateway.auth")

# Generous on purpose: a client that gets its configuration wrong, or a test suite walking every route without
# a token, sends dozens of 401s from one address in a few seconds and must not crawl; a guesser sends thousands.
FREE_FAILURES = 100
WINDOW_S = 10.0
FIRST_DELAY_S = 0.25
DEFAULT_MAX_DELAY_MS = 2000
MAX_SOURCES = 10_000
REPORT_EVERY_S = 60.0


def source_of(remote: str | None) -> str:
    """The back-off's key for a peer address: the address itself; for IPv6 its /64."""
    if not remote:
        return "-"
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return escape_controls(remote)[:64]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class AuthFailures:
    """Counts failed authentications per source; :meth:`failed` gives the delay of the answer."""

    def __init__(
        self,
        max_delay_s: float = DEFAULT_MAX_DELAY_MS / 1000,
        report_every_s: float = REPORT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_delay_s = max_delay_s
        self.report_every_s = report_every_s
        self.clock = clock
        self.total = 0
        # source -> [start of its window, failures in it]; dict order is the order of the latest failure
        self._sources: dict[str, list[float]] = {}
        self._unreported = 0
        self._unreported_sources: set[str] = set()
        self._latest = ""
        self._last_report: float | None = None
        self._report_pending = False

    def failed(self, remote: str | None, reason: str, route: str) -> float:
        """Note one failure from ``remote``; the seconds to wait before answering it."""
        now = self.clock()
        source = source_of(remote)
        entry = self._sources.pop(source, None)
        if entry is None or now - entry[0] >= WINDOW_S:
            entry = [now, 0]
        entry[1] += 1
        self._sources[source] = entry  # now the most recent
        if len(self._sources) > MAX_SOURCES:
            del self._sources[next(iter(self._sources))]
        self.total += 1
        self._note(source, reason, route, now)
        over = int(entry[1]) - FREE_FAILURES
        if over <= 0 or self.max_delay_s <= 0:
            return 0.0
        return min(self.max_delay_s, FIRST_DELAY_S * 2 ** min(over - 1, 16))

    def _note(self, source: str, reason: str, route: str, now: float) -> None:
        """The first failure after a quiet period is logged at once; the ones after it in one WARNING at the
        end of each ``report_every_s`` period (a flood costs a line a minute, not a line per request)."""
        log.debug("failed authentication from %s: %s on %s", source, reason, route)
        self._unreported += 1
        if len(self._unreported_sources) < 1000:
            self._unreported_sources.add(source)
        self._latest = f"{source}: {reason} on {route}"
        if self._last_report is None or now - self._last_report >= self.report_every_s:
            self._report(now)
        elif not self._report_pending:
            self._report_pending = True
            asyncio.get_running_loop().call_later(self._last_report + self.report_every_s - now, self._flush)

    def _flush(self) -> None:
        self._report_pending = False
        if self._unreported:
            self._report(self.clock())

    def _report(self, now: float) -> None:
        sources = len(self._unreported_sources)
        log.warning(
            "%d failed authentication(s) from %s%d source(s) since the last report (latest from %s)",
            self._unreported,
            "at least " if sources >= 1000 else "",
            sources,
            self._latest,
        )
        self._unreported = 0
        self._unreported_sources.clear()
        self._last_report = now
