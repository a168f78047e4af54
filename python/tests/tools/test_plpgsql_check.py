"""Static analysis of every PL/pgSQL function in schema ``awp`` with the ``plpgsql_check`` extension
(``make setup`` installs Debian's postgresql-NN-plpgsql-check).

CREATE FUNCTION checks only the syntax of a PL/pgSQL body; a wrong column or table name, a call with wrong
argument types or a missing RETURN path shows up only when that line first runs. plpgsql_check resolves every
statement against the migrated schema now: any finding of level ``error`` fails. Its warnings (unused
variables, implicit casts) are printed (``pytest -s``), not enforced.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

# Every PL/pgSQL function of schema awp; a trigger function is checked against the table of one of its
# triggers, with that trigger's transition tables (REFERENCING OLD TABLE AS ...) when it has any.
FUNCTIONS = """
SELECT p.oid::regprocedure::text AS name, p.prorettype = 'trigger'::regtype AS is_trigger,
       t.tgrelid::regclass::text AS relid, t.tgoldtable AS oldtable, t.tgnewtable AS newtable
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
  LEFT JOIN LATERAL (
    SELECT * FROM pg_trigger t WHERE t.tgfoid = p.oid
     ORDER BY t.tgoldtable IS NULL AND t.tgnewtable IS NULL, t.tgname LIMIT 1
  ) t ON true
 WHERE p.pronamespace = 'awp'::regnamespace AND l.lanname = 'plpgsql'
 ORDER BY 1
"""

CHECK = """
SELECT level, message, lineno, statement
  FROM plpgsql_check_function_tb(%(name)s::regprocedure, relid => coalesce(%(relid)s::regclass, 0),
                                 oldtable => %(oldtable)s, newtable => %(newtable)s,
                                 extra_warnings => true, performance_warnings => false)
"""


@pytest.fixture(scope="module")
def checked(db_dsn: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as c:
        if not c.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'plpgsql_check'").fetchone():
            # The throwaway cluster runs this machine's PostgreSQL, where `make setup` installs the extension:
            # missing there is a broken set-up. Only a server of the user's own (AWP_TEST_DSN) may lack it.
            if not os.environ.get("AWP_TEST_DSN"):
                pytest.fail("plpgsql_check is not installed: run `make setup` (make plpgsql-check)")
            pytest.skip("plpgsql_check is not installed on the AWP_TEST_DSN server")
        c.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
        yield c


def findings(conn: psycopg.Connection[dict[str, Any]], function: dict[str, Any]) -> list[dict[str, Any]]:
    return conn.execute(CHECK, {"relid": None, "oldtable": None, "newtable": None, **function}).fetchall()


def test_every_plpgsql_function_passes_plpgsql_check(checked: psycopg.Connection[dict[str, Any]]) -> None:
    functions = checked.execute(FUNCTIONS).fetchall()
    assert len(functions) >= 50, f"expected the whole schema, found {len(functions)} PL/pgSQL functions"
    errors: list[str] = []
    warnings: list[str] = []
    for f in functions:
        if f["is_trigger"] and f["relid"] is None:
            continue  # a trigger function no trigger uses: plpgsql_check needs a table to check it against
        for r in findings(checked, f):
            line = f"{f['name']} line {r['lineno']} ({r['statement']}): {r['level']}: {r['message']}"
            (errors if r["level"] == "error" else warnings).append(line)
    print(f"\nplpgsql_check: {len(functions)} functions, {len(errors)} errors, {len(warnings)} warnings")
    print("\n".join(warnings))
    assert errors == [], "\n".join(errors)


def test_plpgsql_check_finds_a_wrong_column_that_create_function_accepts(
    checked: psycopg.Connection[dict[str, Any]],
) -> None:
    """The check above can fail: a body naming a column that does not exist is created fine, and reported."""
    with checked.transaction():
        checked.execute(
            "CREATE FUNCTION awp.__lint_probe(p text) RETURNS bigint LANGUAGE plpgsql AS $$ "
            "DECLARE v bigint; BEGIN SELECT count(*) INTO v FROM awp.runs WHERE no_such_column = p; RETURN v; END $$"
        )
        try:
            found = findings(checked, {"name": "awp.__lint_probe(text)"})
        finally:
            checked.execute("DROP FUNCTION awp.__lint_probe(text)")
    assert [(r["level"], r["message"]) for r in found] == [("error", 'column "no_such_column" does not exist')]
