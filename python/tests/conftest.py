"""Shared fixtures: a real PostgreSQL for the whole session, a fresh migrated database per test module.

- ``pg_cluster`` (session): a throwaway cluster (fsync off), or the server of ``AWP_TEST_DSN``.
- ``db_dsn`` (module): a fresh database migrated from ``db/`` (``AWP_SQL_DIR`` to override), dropped after.
- ``conn`` (function): an autocommit psycopg connection to ``db_dsn``.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from awp.localdb import Server
from awp_testing.cluster import database_name, fresh_database, throwaway_cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Server]:
    with throwaway_cluster() as server:
        yield server


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
