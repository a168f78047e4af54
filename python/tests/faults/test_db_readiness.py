"""The gateway after `awp db down` / `awp db up` (AWP issue 41): ready again within a couple of seconds of the
database being back (it took up to ~25 s: psycopg_pool doubled its reconnection delay after each failed attempt),
and one short readable log line per state change instead of a WARNING per attempt every second or two with
psycopg's multi-line message escaped into it. A real PostgreSQL of its own, stopped and started, and a real
``awp serve``."""

from __future__ import annotations

import inspect
import time

import httpx
import psycopg
import pytest
from fault_support import stoppable_database
from psycopg_pool import AsyncConnectionPool

from awp.dev.localdb import Cluster
from awp.server import pools as db
from awp_testing.gateway import serve, wait_until

pytestmark = pytest.mark.slow  # a 20 s outage: make test-fast skips it

OUTAGE_S = 20.0  # long enough that the old doubling backoff (1, 2, 4, 8, 16 s) would next try ~11 s after `db up`


def test_short_error_is_the_first_line() -> None:
    e = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: Connection refused\n'
        "\tIs the server running on that host and accepting TCP/IP connections?"
    )
    assert (
        db.short_error(e)
        == 'connection failed: connection to server at "127.0.0.1", port 5432 failed: Connection refused'
    )
    assert db.short_error(psycopg.OperationalError("")) == "OperationalError"


def test_reconnection_delay_is_capped() -> None:
    """The pools' reconnection backoff never waits more than RECONNECT_MAX_S, and the psycopg_pool internals it
    hooks (``_add_connection(attempt, growing)``, ``_connect(timeout)``) are still there."""
    attempt = db._CappedAttempt(timeout=3600)
    delays = []
    for _ in range(10):
        attempt.update_delay(time.monotonic())
        delays.append(attempt.delay)
    assert delays[0] <= db.RECONNECT_FIRST_S * 1.2 and max(delays) == db.RECONNECT_MAX_S
    assert list(inspect.signature(AsyncConnectionPool._add_connection).parameters) == ["self", "attempt", "growing"]
    assert list(inspect.signature(AsyncConnectionPool._connect).parameters) == ["self", "timeout"]


def test_ready_soon_after_the_database_is_back_with_one_line_per_change(cluster: Cluster) -> None:
    with stoppable_database(cluster, "readiness") as dsn, serve(dsn, coordinator_interval_ms=500) as gw:
        url = gw.base_url + "/health/ready"
        assert httpx.get(url, timeout=5).status_code == 200
        before = len(gw.log_path.read_text().splitlines())
        cluster.stop("fast")
        wait_until(
            lambda: httpx.get(url, timeout=5).status_code == 503, 10, 0.1, "not ready while the database is down"
        )
        time.sleep(OUTAGE_S)
        cluster.start(fsync=False)
        up = time.monotonic()

        def ready() -> bool:
            try:
                return httpx.get(url, timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, 30, 0.1, "ready again")
        took = time.monotonic() - up
        print(f"ready {took:.2f} s after the database was started again ({OUTAGE_S:.0f} s outage)")
        assert took < 5.0, took  # 0.3 s here (9.7 s before, with a WARNING every 1-2 s); generous for a slow machine
        time.sleep(1.0)
        lines = gw.log_path.read_text().splitlines()[before:]
    warnings = [line for line in lines if line.startswith(("WARNING", "ERROR"))]
    assert len(warnings) <= 3, "\n".join(warnings)  # the coordinator steps down; the database is unreachable
    down = [line for line in lines if "database unreachable:" in line]
    back = [line for line in lines if "database reachable again after" in line]
    assert len(down) == 1 and len(back) == 1, "\n".join(lines)
    assert down[0].startswith("WARNING awp.db: database unreachable: ") and len(down[0]) < 200, down[0]
    assert back[0].startswith("INFO awp.db: database reachable again after "), back[0]
    assert not [line for line in lines if "\\x0a" in line or "\\x09" in line], "\n".join(lines)
    assert not [line for line in lines if "error connecting in" in line]
