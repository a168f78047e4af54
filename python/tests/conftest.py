"""Shared fixtures: a real PostgreSQL for the whole session, a fresh migrated database per test module.

- ``pg_cluster`` (session): a throwaway cluster (fsync off), or the server of ``AWP_TEST_DSN``; with
  ``AWP_TEST_PGBOUNCER=1`` (``make pgbouncer-test``) a PgBouncer in front of it that gateways use.
- ``db_dsn`` (module): a fresh database migrated from ``db/`` (``AWP_SQL_DIR`` to override), dropped after.
- ``conn`` (function): an autocommit psycopg connection to ``db_dsn``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from awp.dev.localdb import Server
from awp_testing import pgbouncer
from awp_testing.cluster import database_name, fresh_database, throwaway_cluster


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
