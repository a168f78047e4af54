"""Helpers for tests and ``make test-db``: throwaway clusters, fresh migrated databases, pg_prove.

``AWP_TEST_DSN`` (a superuser DSN for an existing server) replaces the throwaway cluster: databases are
then created and dropped on that server.

    python -m awp_testing pgprove db/tests     # fresh cluster + migrated database with pgTAP, run pg_prove

:func:`one` runs a query and returns its row (a failure when there is none), typed as the connection's rows
(a tuple, or a dict for a :data:`DictConnection`, one opened with ``row_factory=dict_row``), so that
``one(conn, "SELECT ...")["name"]`` type-checks without an ``assert row is not None`` before each index.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import psycopg
from psycopg.abc import Params, QueryNoTemplate
from psycopg.conninfo import conninfo_to_dict

from awp.dev.localdb import Cluster, ExternalServer, Server, free_port, give_to_server_user
from awp.dev.migrate import default_sql_dir, migrate
from awp.dev.pgbin import pg_bin

log = logging.getLogger(__name__)

Row = TypeVar("Row")

DictConnection: TypeAlias = psycopg.Connection[dict[str, Any]]


def one(conn: psycopg.Connection[Row], query: QueryNoTemplate, params: Params | None = None) -> Row:
    """The first row ``query`` returns; an ``AssertionError`` when it returns none."""
    row = conn.execute(query, params).fetchone()
    if row is None:  # raised, not asserted: benchmarks may run under python -O
        raise AssertionError(f"no row from {query!r}")
    return row


@contextlib.contextmanager
def throwaway_cluster(fsync: bool = False) -> Iterator[Server]:
    """A fresh cluster on a free port (fsync off unless asked: tests want speed, benchmarks honesty),
    destroyed on exit; or ``AWP_TEST_DSN``'s server."""
    env = os.environ.get("AWP_TEST_DSN")
    if env:
        yield ExternalServer(env)
        return
    with local_cluster(fsync) as cluster:
        yield cluster


@contextlib.contextmanager
def local_cluster(fsync: bool = False, prefix: str = "awp-test-") -> Iterator[Cluster]:
    """A fresh cluster of this machine's binaries on a free port (even when AWP_TEST_DSN is set: for
    tests that stop, restart or terminate the server), destroyed on exit."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        give_to_server_user(base)
        cluster = Cluster(base / "data", free_port(), base / "run")
        cluster.init(sync=False)
        cluster.start(fsync=fsync)
        try:
            yield cluster
        finally:
            with contextlib.suppress(Exception):
                cluster.stop(mode="immediate")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def database_name(hint: str) -> str:
    """A valid, unique database name from ``hint`` (e.g. a test module's name)."""
    stem = re.sub(r"[^a-z0-9_]+", "_", hint.lower()).strip("_")[:40] or "db"
    return f"awp_{stem}_{secrets.token_hex(4)}"


def fresh_database(server: Server | str, name: str, with_pgtap: bool = False, sql_dir: Path | None = None) -> str:
    """Create database ``name`` on ``server`` (a Server or a DSN), migrate it, and return its DSN."""
    if isinstance(server, str):
        server = ExternalServer(server)
    dsn = server.create_database(name)
    try:
        migrate(dsn, sql_dir=sql_dir, with_pgtap=with_pgtap)
    except BaseException:
        server.drop_database(name)
        raise
    return dsn


def migrate_before(dsn: str, first_left_out: str, workdir: Path) -> None:
    """Apply this repository's migrations named before ``first_left_out`` (e.g. ``"0011"``; copied to
    ``workdir``) to ``dsn``, and no functions: the schema an older version of AWP left."""
    old = workdir / "db"
    (old / "migrations").mkdir(parents=True)
    (old / "functions").mkdir()
    for f in sorted((default_sql_dir() / "migrations").glob("*.sql")):
        if f.name < first_left_out:
            shutil.copy(f, old / "migrations")
    migrate(dsn, old)


@contextlib.contextmanager
def database_before(server: Server, first_left_out: str, seed: str, workdir: Path) -> Iterator[str]:
    """A new database (its DSN) as an older version of AWP left it, for tests of a migration on stored data:
    ``migrate_before(first_left_out)``, then the statements ``seed``. Dropped on exit."""
    name = database_name(f"before_{first_left_out}")
    dsn = server.create_database(name)
    try:
        migrate_before(dsn, first_left_out, workdir)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(seed.encode())
        yield dsn
    finally:
        server.drop_database(name)


def libpq_env(dsn: str) -> dict[str, str]:
    """PG* environment variables equivalent to ``dsn`` (for psql and pg_prove)."""
    params = conninfo_to_dict(dsn)
    mapping = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "password": "PGPASSWORD", "dbname": "PGDATABASE"}
    return {var: str(params[key]) for key, var in mapping.items() if params.get(key)}


def run_pg_prove(test_dir: Path, extra_args: list[str] | None = None) -> int:
    """Run pg_prove over ``test_dir`` (a directory, or one ``.sql`` file) against a fresh database migrated
    with pgTAP; return its exit code (1 when there is no test file: a run that tests nothing is no pass)."""
    is_file = test_dir.is_file() and test_dir.suffix == ".sql"
    if not is_file and (not test_dir.is_dir() or not any(test_dir.rglob("*.sql"))):
        log.error("no pgTAP test files (*.sql) under %s: nothing to run", test_dir)
        return 1
    pg_prove = shutil.which("pg_prove")
    if not pg_prove:
        log.error("pg_prove not found: run `make setup` (apt-get install -y libtap-parser-sourcehandler-pgtap-perl)")
        return 2
    with throwaway_cluster() as server:
        name = database_name("pgtap")
        dsn = fresh_database(server, name, with_pgtap=True)
        try:
            env = {**os.environ, **libpq_env(dsn)}
            cmd = [pg_prove, "--psql-bin", pg_bin("psql"), "--ext", ".sql", "-r", *(extra_args or []), str(test_dir)]
            log.info("running %s", " ".join(cmd))
            return subprocess.run(cmd, env=env).returncode
        finally:
            server.drop_database(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m awp_testing")
    sub = parser.add_subparsers(dest="command", required=True)
    prove = sub.add_parser("pgprove", help="run pgTAP tests with pg_prove against a fresh migrated database")
    prove.add_argument("test_dir", type=Path, nargs="?", default=Path("db/tests"))
    prove.add_argument("pg_prove_args", nargs=argparse.REMAINDER, help="passed to pg_prove (after --)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    extra = [a for a in args.pg_prove_args if a != "--"]
    return run_pg_prove(args.test_dir, extra)


if __name__ == "__main__":
    sys.exit(main())
