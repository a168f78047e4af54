"""Shared fixtures: a real PostgreSQL for the whole session, a fresh migrated database per test module.

- ``pg_cluster`` (session): a throwaway cluster (fsync off), or the server of ``AWP_TEST_DSN``; with
  ``AWP_TEST_PGBOUNCER=1`` (``make pgbouncer-test``) a PgBouncer in front of it that gateways use.
- ``db_dsn`` (module): a fresh database migrated from ``db/`` (``AWP_SQL_DIR`` to override), dropped after.
- ``conn`` (function): an autocommit psycopg connection to ``db_dsn``.
- ``db`` (function): the same with dict rows, on a database emptied of runs and workers, with default settings
  but ``dispatch_limit`` 100 (the races of several sessions: test_protocol_races, test_lock_order).
- ``fault_dsn`` (function): a fresh migrated database of its own per test, with fault_support's short timings
  (``fault_support.configure``): a scenario that kills gateways and workers leaves nothing to the next.
- ``gateway_login`` (module): the DSN of a plain login that is a member of awp_gateway (EXECUTE on the public
  functions only), as ``awp db up`` makes for ``awp serve``; dropped after the module, with what it owns.
- ``gw`` (module): ``awp serve`` on ``db_dsn`` for all the module's tests; a module tunes it with module-level
  ``GATEWAY_SETTINGS`` (awp.configure's arguments, set before it starts; none: the database's defaults) and
  ``GATEWAY_OPTIONS`` (keyword arguments of :func:`awp_testing.gateway.serve`: ``args``, ``env``,
  ``coordinator_interval_ms``, ...). A module whose gateway needs more (another fixture, a seed) overrides it.
- ``workers`` (function): :class:`worker_support.Workers` of ``gw`` for one test, drained with SIGTERM on the way
  out (``worker_support.drained_workers``); killed instead where the module sets ``DRAIN_WORKERS = False``.
- ``no_live_runs`` (function, for ``pytest.mark.usefixtures``): after the test, cancels every live run of the
  module's database but those of the workflows in the module-level ``KEEP_LIVE_WORKFLOWS``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fault_support import configure
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sync_support import connect
from worker_support import Workers, drained_workers, set_settings

from awp.dev.localdb import Server
from awp_testing import pgbouncer
from awp_testing.cluster import database_name, fresh_database, throwaway_cluster
from awp_testing.gateway import ServeProcess, serve


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Server]:
    with throwaway_cluster() as server:
        if os.environ.get("AWP_TEST_PGBOUNCER") != "1":
            yield server
            return
        # make pgbouncer-test: every gateway's requests go through a PgBouncer in transaction pooling mode in
        # front of this cluster (awp_testing.gateway reads the port from the environment).
        with pgbouncer.pgbouncer(server.dsn()) as port:
            os.environ[pgbouncer.ENV_PORT] = str(port)
            os.environ[pgbouncer.ENV_SERVER] = str(conninfo_to_dict(server.dsn()).get("port", "5432"))
            try:
                yield server
                stats = pgbouncer.console(port, "SHOW STATS")
                assert sum(int(str(r["total_xact_count"])) for r in stats if r["database"] != "pgbouncer") > 0, (
                    "make pgbouncer-test: no transaction went through PgBouncer"
                )
            finally:
                os.environ.pop(pgbouncer.ENV_PORT, None)
                os.environ.pop(pgbouncer.ENV_SERVER, None)


@pytest.fixture(scope="module")
def db_dsn(pg_cluster: Server, request: pytest.FixtureRequest) -> Iterator[str]:
    name = database_name(request.module.__name__.rsplit(".", 1)[-1])
    dsn = fresh_database(pg_cluster, name)
    try:
        yield dsn
    finally:
        pg_cluster.drop_database(name)


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def fault_dsn(pg_cluster: Server, request: pytest.FixtureRequest) -> Iterator[str]:
    name = database_name("fault_" + request.node.name.removeprefix("test_"))
    dsn = fresh_database(pg_cluster, name)
    configure(dsn)
    try:
        yield dsn
    finally:
        pg_cluster.drop_database(name)


@pytest.fixture
def db(db_dsn: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """A superuser connection (dict rows) on a database emptied of runs and workers, with default settings but
    ``dispatch_limit`` 100."""
    with connect(db_dsn) as c:
        c.execute(
            "TRUNCATE awp.events, awp.dispatches, awp.tasks, awp.runs, awp.signals, awp.task_output,"
            " awp.task_progress, awp.run_outputs, awp.ready_queue, awp.workers CASCADE"
        )
        c.execute(
            "SELECT awp.configure(lease_duration_ms => 15000, heartbeat_interval_ms => 5000,"
            " offline_after_heartbeats => 3, dispatch_limit => 100)"
        )
        yield c


@pytest.fixture(scope="module")
def gateway_login(db_dsn: str) -> Iterator[str]:
    role, password = f"awp_login_{secrets.token_hex(4)}", secrets.token_hex(16)
    with psycopg.connect(db_dsn, autocommit=True) as c:
        create = sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE awp_gateway")
        c.execute(create.format(sql.Identifier(role), sql.Literal(password)))
    try:
        yield make_conninfo(db_dsn, user=role, password=password)
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.fixture(scope="module")
def gw(db_dsn: str, request: pytest.FixtureRequest) -> Iterator[ServeProcess]:
    settings: dict[str, int] = getattr(request.module, "GATEWAY_SETTINGS", {})
    if settings:
        set_settings(db_dsn, **settings)
    with serve(db_dsn, **getattr(request.module, "GATEWAY_OPTIONS", {})) as gateway:
        yield gateway


@pytest.fixture
def workers(gw: ServeProcess, request: pytest.FixtureRequest) -> Iterator[Workers]:
    if getattr(request.module, "DRAIN_WORKERS", True):
        yield from drained_workers(gw)
    else:
        with Workers(gw) as ws:
            yield ws


@pytest.fixture
def no_live_runs(db_dsn: str, request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests share one database: cancel every live run afterwards, so none is left for the next test's workers."""
    yield
    kept = list(getattr(request.module, "KEEP_LIVE_WORKFLOWS", ()))
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(
            "SELECT awp.request_cancel(run_id) FROM awp.list_runs(NULL, NULL, NULL, 1000)"
            " WHERE status IN ('pending', 'running') AND workflow_id <> ALL(%s::text[])",
            (kept,),
        )
