"""A frozen active coordinator (SIGSTOP) is replaced within the leader lease, and once it thaws (SIGCONT) it
steps down without writing (db/functions/leadership.sql, docs/protocol.md rule 12).

Two real ``awp serve`` gateways share one database, real workers run a run whose retries need the coordinator
(a waiting_retry task is promoted only by a pass). The active gateway is SIGSTOPped mid-run: its process is
frozen but its database session lives on and holds the coordinator's advisory lock, so only the leader lease
can hand over. The standby must be active within ``leader_lease_ms`` + 2 s (printed), end the frozen leader's
session, and the run must finish. After SIGCONT the old leader logs that it steps down, exactly once, runs no
pass, and the leader row keeps the new term; ``awp.check_invariants()`` stays empty.

The gateways log in either as a superuser (awp_owner may not end a superuser's session: the standby ends it
with its own rights) or as a plain member of awp_gateway (the SECURITY DEFINER function ends it).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import signal
import time
from typing import Any

import httpx
import pytest
from fault_support import assert_clean, configure, ms, query, record, wait_run_db
from worker_support import Workers, apply, mock_task, start_run

from awp.server.coordinator import Coordinator
from awp.server.pools import connect
from awp_testing.gateway import ServeProcess, Tokens, start_serve, wait_until

pytestmark = pytest.mark.slow  # multi-process: make test-fast skips it

LEADER_LEASE_MS = 2000
INTERVAL_MS = 100


def leader(dsn: str) -> dict[str, Any]:
    return query(dsn, "SELECT * FROM awp.get_leader()")[0]


def session_alive(dsn: str, pid: int) -> bool:
    return bool(query(dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)))


def passes(gw: ServeProcess) -> float:
    """awp_coordinator_passes_total of one gateway (its /metrics)."""
    text = httpx.get(gw.url("/metrics"), timeout=5).text
    found = re.search(r"^awp_coordinator_passes_total ([0-9.e+]+)$", text, re.M)
    assert found, "no awp_coordinator_passes_total in /metrics"
    return float(found.group(1))


def log_text(gw: ServeProcess) -> str:
    return gw.log_path.read_text(errors="replace")


@pytest.mark.parametrize("login", ["superuser", "awp_gateway member"])
def test_a_frozen_leader_is_replaced_within_the_lease_and_steps_down_without_writing(
    db_dsn: str, gateway_login: str, login: str
) -> None:
    configure(db_dsn, leader_lease_ms=LEADER_LEASE_MS)
    dsn = db_dsn if login == "superuser" else gateway_login
    tokens = Tokens()
    gateways = [start_serve(dsn, tokens=tokens, coordinator_interval_ms=INTERVAL_MS) for _ in range(2)]
    frozen: ServeProcess | None = None
    try:
        wait_until(lambda: sum(gw.coordinator_active() for gw in gateways) == 1, 15, 0.05, "one active coordinator")
        old, standby = gateways if gateways[0].coordinator_active() else gateways[::-1]
        with Workers(standby) as workers:
            for i in range(2):
                workers.start(f"freeze-{i}", concurrency=2)
            # Every third task fails its first attempt: its retry waits 300 ms in waiting_retry, which only a
            # coordinator pass promotes, so the run cannot finish without an active coordinator.
            tasks = [
                {**mock_task(f"t{i:02}", sleep_ms=150, fail_attempts=1 if i % 3 == 0 else 0),
                 "retry": {"max_attempts": 2, "interval_ms": 300}}
                for i in range(24)
            ]  # fmt: skip
            run_id = start_run(standby, apply(standby, {"id": f"freeze-{secrets.token_hex(3)}", "concurrency": 4,
                                                        "tasks": tasks}))  # fmt: skip
            wait_until(
                lambda: query(db_dsn, "SELECT count(*) AS n FROM awp.tasks WHERE run_id = %s AND status = 'succeeded'",
                              (run_id,))[0]["n"] >= 4, 30, 0.05, "the run under way")  # fmt: skip
            before = leader(db_dsn)
            assert before["lock_holder_pid"] == before["backend_pid"], before

            os.kill(old.pid, signal.SIGSTOP)
            frozen = old
            stopped = time.monotonic()
            wait_until(standby.coordinator_active, LEADER_LEASE_MS / 1000 + 15, 0.01, "the standby to take over")
            took = time.monotonic() - stopped
            after = leader(db_dsn)
            assert after["term"] == before["term"] + 1, (before, after)
            assert after["holder"] != before["holder"] and after["lock_holder_pid"] == after["backend_pid"], after
            assert not session_alive(db_dsn, before["backend_pid"]), "the frozen leader's session was ended"
            # The detector needs the lease; the rest (a standby poll, ending the session, the first pass) is small.
            assert LEADER_LEASE_MS / 1000 - 0.5 < took < LEADER_LEASE_MS / 1000 + 2.0, took
            how = "with this login's own rights" if login == "superuser" else "coordinator taking over"
            wait_until(lambda: how in log_text(standby), 5, 0.05, f"the standby to log '{how}'")
            assert log_text(standby).count("coordinator taking over") == 1, log_text(standby)[-3000:]

            assert wait_run_db(db_dsn, run_id, 60)["status"] == "succeeded", "the run finished under the new leader"
            retried = query(db_dsn, "SELECT count(*) AS n FROM awp.attempts WHERE run_id = %s AND attempt = 2",
                            (run_id,))[0]["n"]  # fmt: skip
            assert retried == 8, "every flaky task was retried once"
            promoted = query(db_dsn, "SELECT count(*) AS n FROM awp.attempts WHERE run_id = %s AND attempt = 2"
                             " AND started_at >= %s", (run_id, after["since"]))[0]["n"]  # fmt: skip
            assert promoted >= 1, "retries that fell due during the freeze were promoted by the new leader"

            os.kill(old.pid, signal.SIGCONT)
            frozen = None
            thawed = time.monotonic()
            wait_until(lambda: "coordinator stepping down" in log_text(old), 15, 0.02, "the old leader to step down")
            stepped = time.monotonic() - thawed
            wait_until(lambda: (r := old.ready()) is not None and not r.get("coordinator_active"), 10, 0.05,
                       "the old gateway to report standby")  # fmt: skip
            old_passes = passes(old)
            seen = leader(db_dsn)["last_seen_at"]
            # Watch a while: the new leader keeps renewing, the old one (now a standby polling every 100 ms) stays out.
            wait_until(lambda: leader(db_dsn)["last_seen_at"] > seen, 10, 0.05, "the new leader to renew")
            time.sleep(LEADER_LEASE_MS / 1000 / 2)
            now = leader(db_dsn)
            assert (now["term"], now["holder"]) == (after["term"], after["holder"]), now
            assert passes(old) == old_passes, "the old leader ran no pass after stepping down"
            assert standby.coordinator_active() and not old.coordinator_active()
            assert log_text(old).count("coordinator stepping down") == 1, log_text(old)[-3000:]

            # Nothing broke: a new run through the old gateway finishes.
            second = start_run(old, apply(old, {"id": f"after-{secrets.token_hex(3)}",
                                                "tasks": [mock_task(f"a{i}") for i in range(4)]}))  # fmt: skip
            assert wait_run_db(db_dsn, second, 30)["status"] == "succeeded"
        assert_clean(db_dsn)
        record(
            f"17_leader_freeze_{'superuser' if login == 'superuser' else 'gateway_role'}",
            leader_lease_ms=LEADER_LEASE_MS,
            coordinator_interval_ms=INTERVAL_MS,
            sigstop_to_standby_active_ms=ms(took),
            sigcont_to_step_down_logged_ms=ms(stepped),
            terms=f"{before['term']}->{after['term']}",
            retried_attempts=retried,
            retries_after_takeover=promoted,
            old_leader_passes_after_step_down=0,
            violations=0,
        )
    finally:
        if frozen is not None:
            os.kill(frozen.pid, signal.SIGCONT)
        for gw in gateways:
            gw.stop()
            gw.log_path.unlink(missing_ok=True)


def test_long_lived_connections_let_both_ends_notice_a_dead_peer(db_dsn: str) -> None:
    """The coordinator's, retention's and the LISTEN connection (awp.server.db.connect) set tcp_user_timeout in libpq
    and, on the server, keepalives, tcp_user_timeout and client_connection_check_interval."""

    async def settings() -> tuple[Any, dict[str, str]]:
        conn = await connect(db_dsn)
        try:
            cur = await conn.execute(
                "SELECT current_setting('client_connection_check_interval'), current_setting('tcp_keepalives_idle'),"
                " current_setting('tcp_keepalives_interval'), current_setting('tcp_keepalives_count'),"
                " current_setting('tcp_user_timeout'), current_setting('TimeZone')"
            )
            return await cur.fetchone(), conn.info.get_parameters()
        finally:
            await conn.close()

    row, params = asyncio.run(settings())
    assert row == ("2s", "10", "3", "3", "10000", "UTC")
    assert params["tcp_user_timeout"] == "10000" and params["keepalives"] == "1", params


def test_a_leader_with_a_long_pass_interval_keeps_the_lead_by_heartbeats(db_dsn: str) -> None:
    """Passes every 30 s, a lease of 1.5 s: awp.leader_heartbeat (every third of the lease) keeps the leader
    renewed, so the standby never takes over from a healthy leader; stopping the leader hands over at once."""
    configure(db_dsn, leader_lease_ms=1500)

    async def scenario() -> tuple[int, int, float]:
        a, b = Coordinator(db_dsn, interval_s=30, holder="a"), Coordinator(db_dsn, interval_s=30, holder="b")
        a.start()
        try:
            async with asyncio.timeout(20):  # bounds a hang only
                while not a.active:
                    await asyncio.sleep(0.02)
                b.start()
                term = a.term
                assert term is not None
                worst = 0
                until = time.monotonic() + 3.5  # more than two leases
                while time.monotonic() < until:
                    worst = max(worst, int(leader(db_dsn)["silent_ms"]))
                    assert a.active and not b.active, "the healthy leader kept the lead"
                    await asyncio.sleep(0.05)
                assert a.passes <= 2, "no pass was due (interval 30 s): heartbeats renewed the lead"
                stopped = time.monotonic()
                await a.stop()
                while not b.active:
                    await asyncio.sleep(0.02)
                return term, worst, time.monotonic() - stopped
        finally:
            await a.stop()
            await b.stop()

    term, worst, handover = asyncio.run(scenario())
    assert worst < 1500, f"the leader was silent for {worst} ms, longer than its lease"
    assert handover < 3.0, "a leader that stops releases the lock: the standby leads within one check (1 s)"
    row = leader(db_dsn)
    assert (row["term"], row["holder"]) == (term + 1, "b")
