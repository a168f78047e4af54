"""The migration runner, against a real PostgreSQL, with SQL written into temporary directories."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from awp.cli.main import main
from awp.dev.localdb import Server, free_port
from awp.dev.migrate import MigrationError, migrate
from awp_testing.cluster import database_name


@pytest.fixture
def empty_db(pg_cluster: Server) -> Iterator[str]:
    name = database_name("migrate")
    dsn = pg_cluster.create_database(name)
    yield dsn
    pg_cluster.drop_database(name)


@pytest.fixture
def sql_dir(tmp_path: Path) -> Path:
    (tmp_path / "migrations").mkdir()
    (tmp_path / "functions").mkdir()
    return tmp_path


def write(sql_dir: Path, relpath: str, text: str) -> None:
    (sql_dir / relpath).write_text(textwrap.dedent(text))


def fetch(dsn: str, query: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


def test_migrations_are_applied_once_in_name_order_and_recorded(empty_db: str, sql_dir: Path) -> None:
    write(sql_dir, "migrations/0002_add_column.sql", "ALTER TABLE t ADD COLUMN b int;")
    write(sql_dir, "migrations/0001_create.sql", "CREATE TABLE t (a int);\nINSERT INTO t VALUES (1);")

    assert migrate(empty_db, sql_dir) == ["0001_create.sql", "0002_add_column.sql"]

    assert fetch(empty_db, "SELECT a, b FROM t") == [(1, None)]
    ledger = fetch(empty_db, "SELECT name, length(checksum) FROM public.awp_schema_migrations ORDER BY name")
    assert ledger == [("0001_create.sql", 64), ("0002_add_column.sql", 64)]


def test_rerun_applies_only_new_migrations(empty_db: str, sql_dir: Path) -> None:
    write(sql_dir, "migrations/0001_create.sql", "CREATE TABLE t (a int);")
    assert migrate(empty_db, sql_dir) == ["0001_create.sql"]
    assert migrate(empty_db, sql_dir) == []

    write(sql_dir, "migrations/0002_more.sql", "CREATE TABLE u (a int);")
    assert migrate(empty_db, sql_dir) == ["0002_more.sql"]


def test_failing_migration_rolls_back_and_names_its_file(empty_db: str, sql_dir: Path) -> None:
    write(sql_dir, "migrations/0001_ok.sql", "CREATE TABLE ok (a int);")
    write(sql_dir, "migrations/0002_bad.sql", "CREATE TABLE half (a int);\n\nSELECT no_such_column FROM ok;\n")

    with pytest.raises(MigrationError, match=r"migrations/0002_bad\.sql line 3") as err:
        migrate(empty_db, sql_dir)
    assert "42703" in str(err.value)

    assert fetch(empty_db, "SELECT to_regclass('public.half') IS NULL") == [(True,)]
    assert fetch(empty_db, "SELECT name FROM public.awp_schema_migrations") == [("0001_ok.sql",)]

    write(sql_dir, "migrations/0002_bad.sql", "CREATE TABLE half (a int);")
    assert migrate(empty_db, sql_dir) == ["0002_bad.sql"]


def test_changed_migration_is_reported_and_not_reapplied(
    empty_db: str, sql_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(sql_dir, "migrations/0001_create.sql", "CREATE TABLE t (a int);")
    migrate(empty_db, sql_dir)
    write(sql_dir, "migrations/0001_create.sql", "CREATE TABLE t (a int, b int);")

    with caplog.at_level(logging.WARNING, logger="awp.migrate"):
        assert migrate(empty_db, sql_dir) == []
    assert "0001_create.sql changed" in caplog.text


def test_concurrent_runners_apply_each_migration_exactly_once(empty_db: str, sql_dir: Path) -> None:
    write(sql_dir, "migrations/0001_log.sql", "CREATE TABLE applied (name text);\nINSERT INTO applied VALUES ('1');")
    write(sql_dir, "migrations/0002_slow.sql", "SELECT pg_sleep(0.3);\nINSERT INTO applied VALUES ('2');")
    write(sql_dir, "migrations/0003_log.sql", "INSERT INTO applied VALUES ('3');")
    write(
        sql_dir,
        "functions/f.sql",
        "CREATE SCHEMA IF NOT EXISTS awp;\nCREATE FUNCTION awp.f() RETURNS int LANGUAGE sql RETURN 1;",
    )

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: migrate(empty_db, sql_dir), range(4)))

    assert sorted(name for r in results for name in r) == ["0001_log.sql", "0002_slow.sql", "0003_log.sql"]
    assert fetch(empty_db, "SELECT name FROM applied ORDER BY name") == [("1",), ("2",), ("3",)]
    assert fetch(empty_db, "SELECT awp.f()") == [(1,)]


def test_functions_are_reapplied_and_a_removed_overload_is_dropped(empty_db: str, sql_dir: Path) -> None:
    write(sql_dir, "migrations/0001_schema.sql", "CREATE SCHEMA awp;")
    write(
        sql_dir,
        "functions/answer.sql",
        """
        CREATE OR REPLACE FUNCTION awp.answer(a int) RETURNS int LANGUAGE sql RETURN 1;
        CREATE OR REPLACE FUNCTION awp.answer(a int, b text) RETURNS int LANGUAGE sql RETURN 2;
        CREATE OR REPLACE PROCEDURE awp.noop() LANGUAGE sql AS $$ SELECT 1 $$;
        """,
    )
    migrate(empty_db, sql_dir)
    overloads = "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE pronamespace = 'awp'::regnamespace ORDER BY 1"
    assert fetch(empty_db, overloads) == [("awp.answer(integer)",), ("awp.answer(integer,text)",), ("awp.noop()",)]

    write(
        sql_dir,
        "functions/answer.sql",
        "CREATE OR REPLACE FUNCTION awp.answer(a int) RETURNS int LANGUAGE sql RETURN 42;",
    )
    migrate(empty_db, sql_dir)

    assert fetch(empty_db, overloads) == [("awp.answer(integer)",)]
    assert fetch(empty_db, "SELECT awp.answer(0)") == [(42,)]


def test_function_used_by_a_table_default_is_kept(empty_db: str, sql_dir: Path) -> None:
    write(
        sql_dir,
        "migrations/0001_ids.sql",
        """
        CREATE SCHEMA awp;
        CREATE FUNCTION awp._new_id() RETURNS text LANGUAGE sql RETURN 'x';
        CREATE TABLE awp.things (id text NOT NULL DEFAULT awp._new_id());
        """,
    )
    write(
        sql_dir,
        "functions/_new_id.sql",
        "CREATE OR REPLACE FUNCTION awp._new_id() RETURNS text LANGUAGE sql RETURN 'y';",
    )
    migrate(empty_db, sql_dir)
    migrate(empty_db, sql_dir)

    with psycopg.connect(empty_db) as conn:
        assert conn.execute("INSERT INTO awp.things DEFAULT VALUES RETURNING id").fetchone() == ("y",)


def test_failing_function_file_names_it_and_leaves_the_old_functions(empty_db: str, sql_dir: Path) -> None:
    write(sql_dir, "migrations/0001_schema.sql", "CREATE SCHEMA awp;")
    write(sql_dir, "functions/a.sql", "CREATE OR REPLACE FUNCTION awp.a() RETURNS int LANGUAGE sql RETURN 1;")
    migrate(empty_db, sql_dir)

    write(sql_dir, "functions/b.sql", "CREATE OR REPLACE FUNCTION awp.b() RETURNS int LANGUAGE plpgsql AS $$ bad $$;")
    with pytest.raises(MigrationError, match=r"functions/b\.sql"):
        migrate(empty_db, sql_dir)

    assert fetch(empty_db, "SELECT awp.a()") == [(1,)]


def test_with_pgtap_creates_the_extension(empty_db: str, sql_dir: Path) -> None:
    migrate(empty_db, sql_dir, with_pgtap=True)
    assert fetch(empty_db, "SELECT count(*) FROM pg_extension WHERE extname = 'pgtap'") == [(1,)]


def test_db_up_status_down_manage_a_project_cluster(
    tmp_path: Path, sql_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    write(sql_dir, "migrations/0001_create.sql", "CREATE TABLE t (a int);")
    monkeypatch.delenv("AWP_DATABASE_URL", raising=False)
    monkeypatch.setenv("AWP_DB_PORT", str(free_port()))
    monkeypatch.setenv("AWP_SQL_DIR", str(sql_dir))
    runner = CliRunner()

    def awp(*args: str) -> tuple[int, str]:
        res = runner.invoke(main, ["db", "--project-dir", str(project), *args])
        return res.exit_code, res.output

    try:
        code, out = awp("up")
        assert code == 0, out
        dsn = out.strip().splitlines()[-1]
        assert dsn.endswith("/awp")
        assert fetch(dsn, "SELECT count(*) FROM t") == [(0,)]

        code, out = awp("up")  # idempotent
        assert code == 0, out
        code, out = awp("status")
        assert code == 0 and "running" in out, out
        code, out = awp("down")
        assert (code, out.strip()) == (0, "stopped")
        code, out = awp("status")
        assert code == 1 and "stopped" in out, out
    finally:
        awp("down", "--purge")
    assert not (project / ".awp" / "cluster.json").exists()


def test_db_commands_defer_to_awp_database_url(empty_db: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AWP_DATABASE_URL", empty_db)
    runner = CliRunner()
    for command in ("up", "down"):
        res = runner.invoke(main, ["db", "--project-dir", str(tmp_path), command])
        assert res.exit_code == 0 and "AWP_DATABASE_URL is set" in res.output
    res = runner.invoke(main, ["db", "status"])
    assert res.exit_code == 0 and "reachable" in res.output, res.output
    assert not (tmp_path / ".awp").exists()
