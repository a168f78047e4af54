"""The error contract is written in four places; these tests keep them equal (no database, no process).

- ``python/awp/server/errors.py``: ``SQLSTATE_ERRORS`` (SQLSTATE -> HTTP status and code) and ``GATEWAY_ERRORS`` (the
  codes the gateway answers by itself); ``ERROR_CODES`` is the union of their codes.
- README.md's SQLSTATE table (section "SQL API").
- ``python/awp/openapi.yaml``: the ``ErrorCode`` enum, the codes and statuses listed in the ``Error`` response,
  the per-item error codes of ``POST /workers/{id}/completions``.
- ``db/functions``: every SQLSTATE raised or caught (``WHEN SQLSTATE '...'``) is mapped by errors.py, or listed
  below as internal (never an answer to a client), and every one of them is raised somewhere. Functions raise
  through one helper per SQLSTATE (``awp._raise_not_found(...)`` and its siblings in 00_helpers.sql, each with
  its ``USING ERRCODE = '...'``): a code counts as raised where its helper is called (or, should a function
  still write one out, where ``USING ERRCODE`` stands outside the helpers).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from awp.server.errors import ERROR_CODES, GATEWAY_ERRORS, SQLSTATE_ERRORS

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"
OPENAPI = REPO / "python" / "awp" / "openapi.yaml"
FUNCTIONS = REPO / "db" / "functions"

# | `AWREQ` | 400 | `invalid_request` | when ... |
README_ROW = re.compile(r"^\| `(?P<sqlstate>[0-9A-Z]{5})` \| (?P<status>\d{3}) \| `(?P<code>[a-z_]+)` \|", re.MULTILINE)
ERRCODE = re.compile(r"\bERRCODE\s*=\s*'(?P<sqlstate>[^']*)'", re.IGNORECASE)
WHEN_SQLSTATE = re.compile(r"\bSQLSTATE\s+'(?P<sqlstate>[^']*)'", re.IGNORECASE)
# CREATE OR REPLACE FUNCTION awp._raise_lease_lost(...) ... END $$; (a helper that raises one SQLSTATE)
RAISE_HELPER = re.compile(
    r"CREATE OR REPLACE FUNCTION awp\.(?P<name>_raise_[a-z_]+)\((?P<body>.*?)END \$\$;", re.DOTALL
)
# -- comments and COMMENT ON statements (one line each here), which name functions without calling them
SQL_COMMENT = re.compile(r"--[^\n]*|^COMMENT ON .*$", re.MULTILINE)
# ApiError(409, "idempotency_conflict", ...) anywhere in the package
# SQLSTATEs that never reach a client, so errors.py does not map them: the caller inside the platform handles them.
INTERNAL_SQLSTATES = {
    "AWLDR": "leadership lost: a fenced coordinator pass, heartbeat or retention batch (db/functions/leadership.sql)",
    "AWGRP": "the group path does not apply: complete_and_claim_many settles the items one by one (complete_task.sql)",
    "AWPIN": "a history range got a run to keep while its drop waited for its locks: not dropped (_partitions.sql)",
}
API_ERROR_LITERAL = re.compile(r"\bApiError\(\s*(?P<status>\d{3})\s*,\s*\"(?P<code>[a-z_]+)\"")


def readme_table() -> dict[str, tuple[int, str]]:
    rows = {}
    for m in README_ROW.finditer(README.read_text()):
        assert m["sqlstate"] not in rows, f"README lists {m['sqlstate']} twice"
        rows[m["sqlstate"]] = (int(m["status"]), m["code"])
    return rows


def openapi() -> dict[str, Any]:
    return yaml.safe_load(OPENAPI.read_text())


def sql_sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(FUNCTIONS.glob("*.sql"))}


def documented_pairs() -> set[tuple[str, int]]:
    """(code, status) of every error errors.py can produce."""
    return {(code, status) for status, code in SQLSTATE_ERRORS.values()} | {
        (code, status) for status, code in GATEWAY_ERRORS.items()
    }


def test_readme_sqlstate_table_equals_errors_py() -> None:
    table = readme_table()
    assert table, "README.md has no SQLSTATE table (rows like | `AWREQ` | 400 | `invalid_request` | ... |)"
    missing = {s: v for s, v in SQLSTATE_ERRORS.items() if s not in table}
    extra = {s: v for s, v in table.items() if s not in SQLSTATE_ERRORS}
    different = {s: (table[s], v) for s, v in SQLSTATE_ERRORS.items() if s in table and table[s] != v}
    assert missing == {}, f"in errors.py, not in README's table: {missing}"
    assert extra == {}, f"in README's table, not in errors.py: {extra}"
    assert different == {}, f"README (status, code) differs from errors.py: {different}"


def test_openapi_error_code_enum_equals_the_codes_of_errors_py() -> None:
    enum = openapi()["components"]["schemas"]["ErrorCode"]["enum"]
    assert len(enum) == len(set(enum)), f"ErrorCode lists a code twice: {enum}"
    assert set(enum) == ERROR_CODES, (
        f"only in openapi.yaml: {sorted(set(enum) - ERROR_CODES)}; only in errors.py: {sorted(ERROR_CODES - set(enum))}"
    )


def test_openapi_error_response_lists_each_code_with_its_status() -> None:
    """The ``Error`` response's description: ``code, code (400); code (401); ...``."""
    text = " ".join(openapi()["components"]["responses"]["Error"]["description"].split())
    listed = text.split("Codes:", 1)[1]
    pairs = set()
    for codes, status in re.findall(r"([a-z_,\s]+?)\s*\((\d{3})\)", listed):
        pairs |= {(code.strip(), int(status)) for code in codes.split(",") if code.strip()}
    assert pairs == documented_pairs(), (
        f"only in openapi.yaml: {sorted(pairs - documented_pairs())}; "
        f"only in errors.py: {sorted(documented_pairs() - pairs)}"
    )


def test_per_item_completion_errors_are_the_sqlstates_complete_tasks_catches() -> None:
    """``complete_tasks`` answers some errors per item instead of failing the batch; the OpenAPI enum of those
    items' codes is exactly the codes of the SQLSTATEs it catches."""
    route = openapi()["paths"]["/api/v1/workers/{worker_id}/completions"]["post"]
    item = route["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["results"]["items"]
    enum = set(item["properties"]["error"]["properties"]["code"]["enum"])
    source = sql_sources()["complete_task.sql"]
    body = source[source.index("CREATE OR REPLACE FUNCTION awp.complete_tasks(") :]
    handler = re.search(r"EXCEPTION\s+WHEN\s+(SQLSTATE\s+'\w+'(?:\s+OR\s+SQLSTATE\s+'\w+')*)\s+THEN", body)
    assert handler is not None, "complete_tasks' per-item EXCEPTION WHEN SQLSTATE ... handler not found"
    caught = set(WHEN_SQLSTATE.findall(handler[1]))
    assert caught, handler[0]
    assert enum == {SQLSTATE_ERRORS[s][1] for s in caught}


def raise_helpers() -> dict[str, str]:
    """{helper name: the SQLSTATE it raises} of the awp._raise_* helpers in db/functions."""
    helpers: dict[str, str] = {}
    for sql in sql_sources().values():
        for m in RAISE_HELPER.finditer(sql):
            codes = ERRCODE.findall(m["body"])
            assert len(codes) == 1, f"awp.{m['name']} should raise exactly one SQLSTATE: {codes}"
            helpers[m["name"]] = codes[0]
    return helpers


def calls_only(sql: str) -> str:
    """The SQL without the raise helpers' own definitions, comments and COMMENT ON statements."""
    return SQL_COMMENT.sub("", RAISE_HELPER.sub("", sql))


def raised_sqlstates() -> dict[str, set[str]]:
    """{SQLSTATE: files that raise it}: the calls of its helper, and any ERRCODE outside the helpers."""
    helpers = raise_helpers()
    raised: dict[str, set[str]] = {}
    for name, sql in sql_sources().items():
        code = calls_only(sql)
        for m in ERRCODE.finditer(code):
            raised.setdefault(m["sqlstate"], set()).add(name)
        for helper, sqlstate in helpers.items():
            if re.search(rf"\bawp\.{helper}\(", code):
                raised.setdefault(sqlstate, set()).add(name)
    return raised


def test_each_sqlstate_has_one_raise_helper_and_each_helper_is_called() -> None:
    helpers = raise_helpers()
    assert len(helpers) >= 5, f"the RAISE_HELPER pattern found too little: {helpers}"
    twice = sorted(s for s in set(helpers.values()) if list(helpers.values()).count(s) > 1)
    assert twice == [], f"more than one helper raises {twice}: {helpers}"
    code = "\n".join(calls_only(sql) for sql in sql_sources().values())
    called = {h for h in helpers if re.search(rf"\bawp\.{h}\(", code)}
    assert called == set(helpers), f"helpers no function calls: {sorted(set(helpers) - called)}"


def test_every_sqlstate_in_db_functions_is_in_errors_py_and_every_entry_is_raised() -> None:
    raised = raised_sqlstates()
    referenced: dict[str, set[str]] = {}
    for name, sql in sql_sources().items():
        for m in WHEN_SQLSTATE.finditer(sql):
            referenced.setdefault(m["sqlstate"], set()).add(name)
    assert len(raised) >= 5, f"the raise patterns found too little: {raised}"
    known = set(SQLSTATE_ERRORS) | set(INTERNAL_SQLSTATES)
    unknown = {s: sorted(files) for s, files in (raised | referenced).items() if s not in known}
    assert unknown == {}, f"SQLSTATEs used in db/functions that errors.py does not map (they would be 500): {unknown}"
    never = sorted(known - set(raised))
    assert never == [], f"errors.py (or INTERNAL_SQLSTATES here) lists SQLSTATEs that no function raises: {never}"
    assert not set(INTERNAL_SQLSTATES) & set(SQLSTATE_ERRORS), (
        "an internal SQLSTATE is mapped in errors.py: drop it here"
    )


def test_error_codes_the_package_answers_with_are_documented() -> None:
    """Every literal ``ApiError(status, "code", ...)`` in python/awp uses a code and status errors.py knows."""
    used: set[tuple[str, int]] = set()
    for path in sorted((REPO / "python" / "awp").rglob("*.py")):
        used |= {(m["code"], int(m["status"])) for m in API_ERROR_LITERAL.finditer(path.read_text())}
    assert used, "no literal ApiError(status, code) found: the pattern is stale"
    assert used <= documented_pairs(), f"not in errors.py: {sorted(used - documented_pairs())}"
