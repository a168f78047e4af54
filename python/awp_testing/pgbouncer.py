"""A PgBouncer (Debian's ``pgbouncer``, 1.18) in transaction pooling mode in front of a test cluster, for
``make pgbouncer-test`` (docs/operations.md, Behind PgBouncer).

    with pgbouncer(server_dsn) as port: ...   # every database of that server, through 127.0.0.1:port

Its ``[databases]`` has one fallback entry (``*``): any database name is passed through to the server, so the
per-module test databases need no configuration. Clients log in as the server's users without a password
(``auth_type = trust``: loopback only). ``connect_query`` gives every server connection the session settings a
gateway's own connections get through libpq ``options`` (which PgBouncer 1.18 does not pass on): UTC, and the
gateway's default lock and statement timeouts. Run as the ``postgres`` OS user when we are root (PgBouncer refuses
to run as root).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from awp.dev.localdb import as_server_user, free_port, give_to_server_user
from awp.server.pools import DEFAULT_LOCK_TIMEOUT_MS, DEFAULT_STATEMENT_TIMEOUT_MS

PGBOUNCER = "/usr/sbin/pgbouncer"
ENV_PORT = "AWP_TEST_PGBOUNCER_PORT"  # set while `make pgbouncer-test` runs: gateways then use it (awp_testing.gateway)
ENV_SERVER = "AWP_TEST_PGBOUNCER_SERVER"  # the port of the server it fronts (a test's own cluster is reached directly)


def binary() -> str:
    found = shutil.which("pgbouncer") or (PGBOUNCER if os.path.exists(PGBOUNCER) else None)
    if found is None:
        raise RuntimeError("pgbouncer is not installed: apt-get install pgbouncer (make pgbouncer-test does it)")
    return found


def session_settings(
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS, statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS
) -> str:
    """The ``connect_query`` giving a pooled server connection a gateway connection's settings."""
    return f"SET TimeZone = UTC; SET lock_timeout = {lock_timeout_ms}; SET statement_timeout = {statement_timeout_ms}"


@contextlib.contextmanager
def pgbouncer(server_dsn: str, pool_size: int = 20) -> Iterator[int]:
    """PgBouncer on a free loopback port in front of ``server_dsn``'s server; yields the port, stops it on exit."""
    server = conninfo_to_dict(server_dsn)
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="awp-pgbouncer-"))
    try:
        give_to_server_user(work)
        (work / "userlist.txt").write_text('"postgres" ""\n')
        ini = work / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={server.get('host', '127.0.0.1')} port={server.get('port', 5432)}"
            f" connect_query='{session_settings()}'\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            f"unix_socket_dir = {work}\n"
            "auth_type = trust\n"
            f"auth_file = {work / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 1000\n"
            "server_reset_query =\n"
            "admin_users = postgres\n"
            "stats_period = 1\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {work / 'pgbouncer.log'}\n"
            f"pidfile = {work / 'pgbouncer.pid'}\n"
        )
        for f in work.iterdir():
            give_to_server_user(f)
        # A session of its own: no signal meant for the test process's group reaches it, and stopping it reaches
        # PgBouncer itself, not only the runuser that starts it as the server's user (which would leave it running).
        # Its stderr goes to a file: PgBouncer not daemonized logs there as well as to its logfile, and a pipe no one
        # reads fills up (64 kB: stats_period = 1 writes a line a second) and then blocks PgBouncer, every client
        # with it (what made `make pgbouncer-test` fail late in the suite).
        stderr_path = work / "pgbouncer.stderr"
        with stderr_path.open("wb") as stderr:
            proc = subprocess.Popen(
                as_server_user([binary(), str(ini)]),
                cwd="/",
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 10
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = stderr_path.read_text(errors="replace")
                    log = (work / "pgbouncer.log").read_text() if (work / "pgbouncer.log").exists() else ""
                    raise RuntimeError(f"pgbouncer did not start: {err}{log}")
                time.sleep(0.05)
            yield port
        finally:
            stop(proc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the PgBouncer of ``proc`` (and its runuser): SIGTERM to its process group (Debian's 1.18 shuts down at
    once on SIGTERM; from 1.23 SIGTERM waits for clients and SIGINT is immediate, so both are sent), SIGKILL after
    5 s."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def pooled_dsn(dsn: str, port: int) -> str:
    """``dsn`` (a test database on the cluster) through the PgBouncer on ``port``."""
    return make_conninfo(dsn, host="127.0.0.1", port=str(port))


def console(port: int, command: str) -> list[dict[str, object]]:
    """A command of the PgBouncer console on ``port`` (``SHOW STATS``, ``SHOW POOLS``, ...): its rows."""
    with psycopg.connect(
        host="127.0.0.1",
        port=port,
        dbname="pgbouncer",
        user="postgres",
        connect_timeout=10,
        autocommit=True,
        cursor_factory=psycopg.ClientCursor,
        row_factory=dict_row,
    ) as conn:
        return conn.execute(command).fetchall()


def fronts(dsn: str) -> int | None:
    """While ``make pgbouncer-test`` runs: the PgBouncer port when ``dsn`` is on the server it fronts, else None."""
    port, server = os.environ.get(ENV_PORT), os.environ.get(ENV_SERVER)
    if not port or str(conninfo_to_dict(dsn).get("port", "5432")) != server:
        return None
    return int(port)
