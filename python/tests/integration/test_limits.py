"""Each limit of the SQL API is defined once (AWP issue 17): a constant ``awp._limit_*()`` in
db/functions/00_limits.sql, or for the settings a row of ``awp._setting_ranges()``. These tests hold every other
place to that definition: the table CHECKs that enforce a limit again (read from ``awp.check_rules``), the Python
constants that mirror one, the documentation, and the functions themselves (no literal copy of a limit is left
in db/functions; each function accepts a value right at its limit and refuses one past it). Database only."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from awp.cli.retention import parse_duration
from awp.protocol import limits as wire
from awp.protocol import results
from awp.server import parsing
from awp.worker import completer

REPO = Path(__file__).resolve().parents[3]
FUNCTIONS = REPO / "db" / "functions"
LIMITS_FILE = FUNCTIONS / "00_limits.sql"


def scalar(conn: psycopg.Connection, sql: str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def limits(conn: psycopg.Connection) -> dict[str, int]:
    """{name: value} of every awp._limit_<name>() (they take no argument)."""
    names = [
        r[0]
        for r in conn.execute(
            "SELECT substr(proname, 8) FROM pg_proc"
            " WHERE pronamespace = 'awp'::regnamespace AND proname LIKE '\\_limit\\_%'"
        )
    ]
    assert len(names) >= 9, f"the limit constants are missing: {names}"
    return {name: int(scalar(conn, f"SELECT awp._limit_{name}()")) for name in names}


def check_constraint(conn: psycopg.Connection, table: str, name: str) -> str:
    # A CHECK constraint's, or a rule of the table's rules function (migration 0025_table_rules): awp.check_rules.
    sql = "SELECT definition FROM awp.check_rules WHERE table_name = %s::regclass AND rule = %s"
    return str(scalar(conn, sql, (table, name)))


# (limit, table, CHECK constraint, its definition with the limit as the one group)
CHECKS = [
    ("input_bytes", "awp.schedules", "schedule_input_size", r"CHECK \(\(octet_length\(\(input\)::text\) <= (\d+)\)\)"),
    ("error_code_chars", "awp.dispatches", "attempt_error_code_length", r"CHECK \(\(length\(error_code\) <= (\d+)\)\)"),
    (
        "progress_bytes",
        "awp.task_progress",
        "task_progress_value_size",
        r"CHECK \(\(octet_length\(\(progress\)::text\) <= (\d+)\)\)",
    ),
    (
        "error_message_bytes",
        "awp.dispatches",
        "attempt_error_message_length",
        r"CHECK \(\(octet_length\(error_message\) <= (\d+)\)\)",
    ),
]


@pytest.mark.parametrize(("limit", "table", "name", "pattern"), CHECKS, ids=[c[2] for c in CHECKS])
def test_each_check_constraint_enforces_the_limit_the_functions_use(
    conn: psycopg.Connection, limit: str, table: str, name: str, pattern: str
) -> None:
    definition = check_constraint(conn, table, name)
    m = re.fullmatch(pattern, definition)
    assert m is not None, f"{table}.{name} changed shape: {definition}"
    assert int(m[1]) == limits(conn)[limit], f"{table}.{name} ({definition}) differs from awp._limit_{limit}()"


def test_the_python_constants_equal_the_database_limits(conn: psycopg.Connection) -> None:
    db = limits(conn)
    assert db["output_bytes"] == results.MAX_OUTPUT_BYTES
    assert db["error_code_chars"] == results.MAX_ERROR_CODE_CHARS
    assert db["error_message_bytes"] == results.MAX_ERROR_MESSAGE_BYTES
    assert db["batch_results"] == wire.MAX_BATCH_RESULTS == wire.MAX_BATCH_LEASES
    assert db["batch_runs"] == wire.MAX_BATCH_RUNS
    assert db["heartbeat_list"] == wire.MAX_HEARTBEAT_LIST == wire.MAX_PENDING_CLAIMS
    assert db["progress_bytes"] == wire.MAX_PROGRESS_BYTES
    assert db["progress_entry_bytes"] == wire.MAX_ENTRY_BYTES
    assert db["progress_entries"] == wire.MAX_ENTRIES
    assert completer.MAX_BATCH <= wire.MAX_BATCH_RESULTS  # the worker sends smaller batches than the gateway takes
    # The gateway's pages are smaller on purpose (python/awp/server/parsing.py); the SQL API's bound must admit them.
    assert 1 <= parsing.PAGE_LIMIT_DEFAULT <= parsing.PAGE_LIMIT_MAX <= db["page_rows"]


def test_the_documented_limits_are_the_database_limits(conn: psycopg.Connection) -> None:
    db = limits(conn)
    data_flow = (REPO / "docs" / "data-flow.md").read_text()
    assert f"{db['input_bytes']:,} bytes" in data_flow
    assert f"{db['lease_payload_bytes']:,} bytes" in data_flow
    assert db["lease_payload_bytes"] == db["run_output_bytes"] == 1024 * 1024, "docs/data-flow.md says 1 MiB for both"
    protocol = (REPO / "docs" / "protocol.md").read_text()
    assert f"{db['output_bytes']:,} bytes" in protocol
    assert f"{db['error_code_chars']} characters" in protocol
    assert f"{db['error_message_bytes']:,} UTF-8 bytes" in protocol


def test_no_literal_copy_of_a_limit_is_left_in_db_functions(conn: psycopg.Connection) -> None:
    """A limit's number written anywhere but 00_limits.sql is a second definition. Only the numbers that
    mean nothing else are looked for (1000 or 128 also count other things, and 86,400,000, a day, also bounds a
    task's timeout_ms and retry interval)."""
    db = limits(conn)
    distinctive = {str(db[n]) for n in ("input_bytes", "output_bytes", "error_message_bytes", "lease_payload_bytes")}
    distinctive |= {str(hi) for _, hi, _ in setting_ranges(conn).values() if hi >= 1_000_000 and hi != 86_400_000}
    found = []
    for path in sorted(FUNCTIONS.glob("*.sql")):
        if path == LIMITS_FILE:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("--", 1)[0]
            found += [f"{path.name}:{number}: {line.strip()}" for n in distinctive if re.search(rf"\b{n}\b", code)]
    assert found == [], "a limit is written out instead of calling its awp._limit_*() constant:\n" + "\n".join(found)
    configure = (FUNCTIONS / "configure.sql").read_text()
    assert "awp._setting_ranges()" in configure and not re.search(r"BETWEEN \d", configure)


def setting_ranges(conn: psycopg.Connection) -> dict[str, tuple[int, int, str]]:
    rows = conn.execute("SELECT setting, lo, hi, note FROM awp._setting_ranges()").fetchall()
    return {r[0]: (int(r[1]), int(r[2]), str(r[3])) for r in rows}


BOUND = r"'?(\d+)'?(?:::bigint)?"


def test_the_settings_checks_are_the_ranges_configure_applies(conn: psycopg.Connection) -> None:
    """Every range CHECK of awp.settings is one row of awp._setting_ranges(), and every row has its CHECK."""
    checks = {}
    for (definition,) in conn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = 'awp.settings'::regclass AND contype = 'c'"
    ):
        # CHECK (((x >= 10) AND (x <= 3600000))); a bigint bound prints as '3153600000000'::bigint
        m = re.fullmatch(rf"CHECK \(\(\((\w+) >= {BOUND}\) AND \(\1 <= {BOUND}\)\)\)", definition)
        if m:
            checks[m[1]] = (int(m[2]), int(m[3]))
    ranges = {name: (lo, hi) for name, (lo, hi, _) in setting_ranges(conn).items()}
    assert len(checks) >= 6, f"the settings CHECKs changed shape: {checks}"
    assert ranges == checks


def configure(conn: psycopg.Connection, **settings: int) -> str | None:
    """The AWREQ message of awp.configure(**settings) (None when it accepts them), rolled back either way. The lease
    and the heartbeat interval are set far apart unless given, so that only the range of the setting tried counts."""
    args = {"lease_duration_ms": 86_400_000, "heartbeat_interval_ms": 10, **settings}
    named = ", ".join(f"{k} => %({k})s" for k in args)
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(f"SELECT awp.configure({named})", args)
    except psycopg.Error as e:
        assert e.sqlstate == "AWREQ", e
        return f"{e.diag.message_primary}: {e.diag.message_detail}"
    return None


def test_configure_accepts_each_end_of_each_range_and_refuses_one_past_it(conn: psycopg.Connection) -> None:
    for name, (lo, hi, _) in setting_ranges(conn).items():
        assert configure(conn, **{name: lo}) is None, f"{name} = {lo} (its lowest) is refused"
        assert configure(conn, **{name: hi}) is None, f"{name} = {hi} (its highest) is refused"
        for bad in (lo - 1, hi + 1):
            message = configure(conn, **{name: bad})
            assert message is not None and message.startswith(f"invalid {name}:"), (name, bad, message)
            assert f"from {lo} to {hi}" in message


def test_configure_warns_of_an_offline_window_under_two_seconds(conn: psycopg.Connection) -> None:
    """A window (heartbeat_interval_ms x offline_after_heartbeats) under 2 s is applied, with a WARNING: a worker
    waits up to max(1 s, 2 heartbeats) for a heartbeat's answer (docs/operations.md). Only a call that sets one of
    the two warns; the window's end (2,000 ms) does not."""
    notices: list[str] = []  # read in the handler: a Diagnostic is empty after it returns

    def handler(d: psycopg.errors.Diagnostic) -> None:
        notices.append(f"{d.severity}: {d.message_primary} / {d.message_hint}")

    conn.add_notice_handler(handler)

    def warned(**settings: int) -> list[str]:
        notices.clear()
        with conn.transaction(force_rollback=True):
            conn.execute("SELECT awp.configure(heartbeat_interval_ms => 150, offline_after_heartbeats => 20)")
            named = ", ".join(f"{k} => %s" for k in settings)
            applied = scalar(conn, f"SELECT awp.configure({named})", tuple(settings.values()))
            for name, value in settings.items():
                assert applied[name] == value, (name, applied)
        return [n for n in notices if n.startswith("WARNING: ")]

    try:
        low = warned(heartbeat_interval_ms=150, offline_after_heartbeats=3)
        assert low == [
            "WARNING: workers go offline after 450 ms without a heartbeat, under 2 s"
            " / raise heartbeat_interval_ms or offline_after_heartbeats (docs/operations.md)"
        ]
        assert len(warned(offline_after_heartbeats=13)) == 1  # 150 x 13 = 1,950 ms
        assert warned(offline_after_heartbeats=14) == []  # 2,100 ms
        assert warned(heartbeat_interval_ms=100) == []  # 100 x 20 = 2,000 ms: the end itself
        assert warned(dispatch_limit=7) == []  # neither set: a window set earlier is not warned of again
    finally:
        conn.remove_notice_handler(handler)


def test_the_retention_the_cli_parses_is_the_range_the_database_takes(conn: psycopg.Connection) -> None:
    _, hi, _ = setting_ranges(conn)["retention_ms"]
    assert parse_duration(f"{hi}ms").total_seconds() * 1000 == hi
    with pytest.raises(ValueError, match="more than 100 years"):
        parse_duration(f"{hi + 1}ms")


def _object_of_size(size: int) -> dict[str, str]:
    """A JSON object whose jsonb text is exactly ``size`` bytes: {"k": "xxx…"}."""
    return {"k": "x" * (size - len('{"k": ""}'))}


def _refusal(conn: psycopg.Connection, call: Callable[[], Any]) -> str | None:
    try:
        with conn.transaction(force_rollback=True):
            call()
    except psycopg.Error as e:
        assert e.sqlstate == "AWREQ", e
        return str(e.diag.message_detail)
    return None


def test_each_input_is_accepted_at_the_limit_and_refused_one_byte_past_it(conn: psycopg.Connection) -> None:
    limit = limits(conn)["input_bytes"]
    workflow = {"id": "wf", "tasks": [{"key": "a", "executor": "mock"}]}
    conn.execute("SELECT awp.create_workflow_version(%s)", (Jsonb(workflow),))

    def task(size: int) -> Callable[[], Any]:
        definition = {"id": "big", "tasks": [{"key": "a", "executor": "mock", "input": _object_of_size(size)}]}
        return lambda: conn.execute("SELECT awp.create_workflow_version(%s)", (Jsonb(definition),))

    def run(size: int) -> Callable[[], Any]:
        return lambda: conn.execute("SELECT awp.start_run('wf', p_input => %s)", (Jsonb(_object_of_size(size)),))

    def schedule(size: int) -> Callable[[], Any]:
        sql = "SELECT awp.create_schedule('s', 'wf', interval_ms => 60000, input => %s)"
        return lambda: conn.execute(sql, (Jsonb(_object_of_size(size)),))

    for name, make in (("task input", task), ("run input", run), ("schedule input", schedule)):
        assert _refusal(conn, make(limit)) is None, f"a {name} of exactly {limit} bytes is refused"
        detail = _refusal(conn, make(limit + 1))
        assert detail is not None and f"{limit + 1} bytes, over the {limit}-byte limit" in detail, (name, detail)


def test_the_dependency_edges_of_a_definition_are_bounded(conn: psycopg.Connection) -> None:
    """A dense graph within the task limit (each task depending on every earlier one) is refused at once with
    AWREQ; exactly the limit is stored (AWP issue 44: 2 million edges took 11 s and could not start)."""
    limit = limits(conn)["definition_edges"]
    assert str(f"{limit:,}") in (REPO / "docs" / "limits.md").read_text()

    def fan_in(edges: int) -> Callable[[], Any]:  # one task depending on `edges` others
        tasks: list[dict[str, Any]] = [{"key": f"t{i}", "executor": "mock"} for i in range(edges)]
        tasks.append({"key": "merge", "executor": "mock", "depends_on": [f"t{i}" for i in range(edges)]})
        return lambda: conn.execute("SELECT awp.create_workflow_version(%s)", (Jsonb({"id": "fan", "tasks": tasks}),))

    # The limit's worth of entries over four merge tasks of the same roots, so the tasks stay within 10,000.
    def merges(edges: int) -> Callable[[], Any]:
        sizes = [edges // 4 + (1 if i < edges % 4 else 0) for i in range(4)]
        tasks: list[dict[str, Any]] = [{"key": f"t{i}", "executor": "mock"} for i in range(max(sizes))]
        for m, n in enumerate(sizes):
            tasks.append({"key": f"m{m}", "executor": "mock", "depends_on": [f"t{i}" for i in range(n)]})
        return lambda: conn.execute("SELECT awp.create_workflow_version(%s)", (Jsonb({"id": "fan", "tasks": tasks}),))

    assert _refusal(conn, fan_in(500)) is None
    assert _refusal(conn, merges(limit)) is None, f"exactly {limit} depends_on entries are refused"
    detail = _refusal(conn, merges(limit + 1))
    assert detail is not None and f"{limit + 1} entries in all, over the limit of {limit}" in detail, detail
    dense = [{"key": f"t{i}", "executor": "mock", "depends_on": [f"t{j}" for j in range(i)]} for i in range(1000)]
    detail = _refusal(conn, lambda: conn.execute("SELECT awp.create_workflow_version(%s)",
                                                 (Jsonb({"id": "dense", "tasks": dense}),)))  # fmt: skip
    assert detail is not None and "499500 entries in all" in detail, detail
    assert conn.execute("SELECT count(*) FROM awp.workflows WHERE workflow_id = 'dense'").fetchone() == (0,)
