"""Apply the SQL in ``db/``: forward-only migrations once each, then every function file again.

Layout (``AWP_SQL_DIR``, else ``<repo root>/db``):

- ``migrations/NNNN_name.sql`` — applied once, in name order, each in its own transaction together with
  its row in the ledger ``public.awp_schema_migrations``. A recorded migration whose file changed is
  reported (warning) and not re-applied.
- ``functions/*.sql`` — code, not state: re-applied on every run, in file-name order, all in ONE
  transaction. Before that, in the same transaction, every routine in schema ``awp`` that is not part of
  an extension is dropped, so a changed signature never leaves a stale overload behind. Routines that a
  table default, constraint, trigger, view or index uses cannot be dropped without losing that object;
  they are kept (and replaced by CREATE OR REPLACE) and logged. Dropping a function also drops its
  grants and comment, so grants belong in a functions file that sorts last.

A session advisory lock serialises concurrent runners (two ``awp serve`` starting at once).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from pathlib import Path

import psycopg

log = logging.getLogger("awp.migrate")  # the log's name, not the module's (docs/operations.md, Logs)

ADVISORY_LOCK_KEY = 0x4157_505F_4D49_4752  # "AWP_MIGR"
LEDGER = "public.awp_schema_migrations"
MIGRATION_NAME = re.compile(r"^\d{4}_[A-Za-z0-9_.-]+\.sql$")


class MigrationError(RuntimeError):
    """A SQL file failed; the message names the file (and the line when PostgreSQL reports a position)."""

    def __init__(self, path: Path, cause: BaseException, text: str = "") -> None:
        where = path.name
        position = getattr(getattr(cause, "diag", None), "statement_position", None)
        if position and text:
            with_pos = text[: int(position)]
            where += f" line {with_pos.count(chr(10)) + 1}"
        sqlstate = getattr(cause, "sqlstate", None)
        super().__init__(f"{path.parent.name}/{where}: {cause}" + (f" (SQLSTATE {sqlstate})" if sqlstate else ""))
        self.path = path


def default_sql_dir() -> Path:
    """``AWP_SQL_DIR``, else the repository's ``db/`` (python/awp/../../db)."""
    env = os.environ.get("AWP_SQL_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "db"


def _checksum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def migration_files(sql_dir: Path) -> list[Path]:
    folder = sql_dir / "migrations"
    if not folder.is_dir():
        return []
    files = []
    for path in sorted(folder.glob("*.sql")):
        if MIGRATION_NAME.match(path.name):
            files.append(path)
        else:
            log.warning("ignoring %s: migration files are named NNNN_name.sql", path)
    return files


def function_files(sql_dir: Path) -> list[Path]:
    folder = sql_dir / "functions"
    return sorted(folder.glob("*.sql")) if folder.is_dir() else []


_ROUTINES_SQL = """
SELECT p.oid::int8, p.oid::regprocedure::text
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'awp'
  AND NOT EXISTS (
    SELECT 1 FROM pg_catalog.pg_depend d
    WHERE d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
"""

_DEPENDENTS_SQL = """
SELECT d.refobjid::int8, d.classid = 'pg_catalog.pg_proc'::regclass, d.objid::int8,
       pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid)
FROM pg_catalog.pg_depend d
WHERE d.refclassid = 'pg_catalog.pg_proc'::regclass AND d.refobjid = ANY(%s::oid[]) AND d.deptype <> 'e'
"""


def _drop_awp_routines(conn: psycopg.Connection) -> list[str]:
    """Drop every non-extension routine in schema awp that nothing but other dropped routines uses."""
    if conn.execute("SELECT to_regnamespace('awp') IS NULL").fetchone() == (True,):
        return []
    routines = {oid: name for oid, name in conn.execute(_ROUTINES_SQL).fetchall()}
    if not routines:
        return []
    dependents = conn.execute(_DEPENDENTS_SQL, (list(routines),)).fetchall()
    droppable = set(routines)
    changed = True
    while changed:  # keep a routine when anything we do not drop depends on it, transitively
        changed = False
        for ref, is_routine, obj, what in dependents:
            if ref in droppable and not (is_routine and obj in droppable):
                droppable.discard(ref)
                changed = True
                log.debug("keeping %s: %s depends on it (change its signature by migration)", routines[ref], what)
    names = sorted(routines[oid] for oid in droppable)
    if names:
        conn.execute("DROP ROUTINE " + ", ".join(names))
    return names


def migrate(dsn: str, sql_dir: Path | str | None = None, with_pgtap: bool = False) -> list[str]:
    """Bring the database at ``dsn`` up to date; return the names of the migrations applied now."""
    sql_dir = Path(sql_dir) if sql_dir else default_sql_dir()
    if not sql_dir.is_dir():
        raise FileNotFoundError(f"SQL directory {sql_dir} does not exist (set AWP_SQL_DIR)")
    applied: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: log.debug("%s: %s", d.severity, d.message_primary))
        conn.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_LOCK_KEY,))
        try:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {LEDGER} ("
                " name text PRIMARY KEY, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done: dict[str, str] = dict(conn.execute(f"SELECT name, checksum FROM {LEDGER}").fetchall())
            for path in migration_files(sql_dir):
                data = path.read_bytes()
                checksum = _checksum(data)
                if path.name in done:
                    if done[path.name] != checksum:
                        log.warning("migration %s changed after it was applied; not re-applying it", path.name)
                    continue
                text = data.decode()
                try:
                    with conn.transaction():
                        conn.execute(text)  # a whole script: no parameters, sent as is
                        conn.execute(f"INSERT INTO {LEDGER} (name, checksum) VALUES (%s, %s)", (path.name, checksum))
                except psycopg.Error as e:
                    raise MigrationError(path, e, text) from e
                log.info("applied migration %s", path.name)
                applied.append(path.name)

            functions = function_files(sql_dir)
            with conn.transaction():
                dropped = _drop_awp_routines(conn)
                log.debug("dropped %d awp routines before re-applying functions", len(dropped))
                for path in functions:
                    text = path.read_text()
                    try:
                        with conn.transaction():  # a savepoint, so the error can name this file
                            conn.execute(text)
                    except psycopg.Error as e:
                        raise MigrationError(path, e, text) from e
            log.info("re-applied %d function files", len(functions))

            if with_pgtap:
                try:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS pgtap")
                except psycopg.Error as e:
                    raise RuntimeError(
                        f"cannot create extension pgtap ({e}); install it: apt-get install -y "
                        "postgresql-15-pgtap (match your server's major version)"
                    ) from e
        finally:
            with contextlib.suppress(psycopg.Error):  # closing the session releases the lock anyway
                conn.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK_KEY,))
    return applied
