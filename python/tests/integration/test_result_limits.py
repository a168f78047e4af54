"""One definition of a result's limits (AWP issue 13): the constants of awp.protocol.results equal what the database
enforces (read from its catalog), the worker measures an output exactly as PostgreSQL does (octets of its jsonb
text, not of compact JSON), and at every limit the worker's check and the database's agree: right at the limit
both accept, one byte over both refuse. No process: the database and the gateway's strict reader."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from awp.protocol import jsonio
from awp.protocol.results import (
    FAILURE_KINDS,
    MAX_ERROR_CODE_CHARS,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_OUTPUT_BYTES,
    MAX_OUTPUT_NESTING,
    OUTPUT_NOT_JSON,
    OUTPUT_TOO_LARGE,
    RESULT_KINDS,
    check_result,
    jsonb_text_size,
    numeric_text,
    refuses_result,
    rejected,
)


def scalar(conn: psycopg.Connection, sql: str, params: tuple[Any, ...]) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def function_source(conn: psycopg.Connection, signature: str) -> str:
    return str(scalar(conn, "SELECT pg_get_functiondef(%s::regprocedure)", (signature,)))


def constraint(conn: psycopg.Connection, name: str) -> str:
    # The attempt's columns are stored on its dispatch (db/migrations/0010_fold_attempts.sql), its rules in
    # awp._dispatches_rules (0025_table_rules), listed by awp.check_rules.
    sql = "SELECT definition FROM awp.check_rules WHERE rule = %s AND table_name = 'awp.dispatches'::regclass"
    return str(scalar(conn, sql, (name,)))


def sql_refusal(conn: psycopg.Connection, result: Mapping[str, Any]) -> str | None:
    """The message of awp._check_result for ``result`` as the gateway hands it over (Jsonb), None if accepted."""
    try:
        conn.execute("SELECT awp._check_result(%s)", (Jsonb(result),))
    except psycopg.Error as e:
        assert e.sqlstate == "AWREQ", e
        return f"{e.diag.message_primary}: {e.diag.message_detail}"
    return None


def test_the_database_enforces_the_limits_of_awp_results(conn: psycopg.Connection) -> None:
    check = function_source(conn, "awp._check_result(jsonb)")
    # A PL/pgSQL body is kept as written: these are the lines of db/functions/complete_task.sql, each comparing
    # with its constant of db/functions/00_limits.sql (python/tests/integration/test_limits.py holds the constants).
    found = {
        "output": re.search(r"octet_length\(\(p\s*->\s*'output'\)::text\)\s*>\s*awp\.(_limit_\w+)\(\)", check),
        "error_code": re.search(r"\blength\(p\s*->>\s*'error_code'\)\s*>\s*awp\.(_limit_\w+)\(\)", check),
        "error_message": re.search(r"octet_length\(p\s*->>\s*'error_message'\)\s*>\s*awp\.(_limit_\w+)\(\)", check),
    }
    limits = {name: int(scalar(conn, f"SELECT awp.{m[1]}()", ())) for name, m in found.items() if m is not None}
    assert limits == {
        "output": MAX_OUTPUT_BYTES,
        "error_code": MAX_ERROR_CODE_CHARS,
        "error_message": MAX_ERROR_MESSAGE_BYTES,
    }, f"a limit of awp._check_result differs from awp.protocol.results (or moved):\n{check}"
    kinds = re.search(r"p\s*->>\s*'kind'\s+NOT IN \(([^)]*)\)", check)
    assert kinds is not None
    assert tuple(re.findall(r"'([a-z_]+)'", kinds[1])) == RESULT_KINDS
    # The attempts table keeps the same limits as CHECK constraints (a second line of defence).
    code_check = re.fullmatch(
        r"CHECK \(\(length\(error_code\) <= (\d+)\)\)", constraint(conn, "attempt_error_code_length")
    )
    message_check = re.fullmatch(
        r"CHECK \(\(octet_length\(error_message\) <= (\d+)\)\)", constraint(conn, "attempt_error_message_length")
    )
    assert code_check is not None and int(code_check[1]) == MAX_ERROR_CODE_CHARS
    assert message_check is not None and int(message_check[1]) == MAX_ERROR_MESSAGE_BYTES


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(9 if depth < 4 else 6)
    if pick == 0:
        return rng.choice([None, True, False])
    if pick == 1:
        return rng.randint(-(10 ** rng.randint(0, 30)), 10 ** rng.randint(0, 30))
    if pick == 2:  # floats of every magnitude: numeric prints them positionally
        return rng.choice([-1, 1]) * rng.random() * 10 ** rng.randint(-320, 308)
    if pick == 3:
        return rng.choice([0.0, -0.0, 0.1, 1.0, 1e16, 1e-7, 5e-324, 1.7976931348623157e308, 123456789.0, -2.5e-05])
    if pick in (4, 5):
        alphabet = 'ab"\\/\n\t\r\b\f\x01\x1f\x7fé€😀\u2028 '
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
    if pick in (6, 7):
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {str(_random_value(rng, 4)): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def test_jsonb_text_size_is_what_postgresql_measures(conn: psycopg.Connection) -> None:
    rng = random.Random(13)
    values: list[Any] = [[], {}, "", 0, None, {"a": 1, "b": [1, 2]}, [1e22, -0.0, 1e-7], {"k": {"é": ["😀"]}}]
    values += [_random_value(rng) for _ in range(400)]
    # What the worker sends, as the gateway reads it and hands it to the database (Jsonb of the parsed value).
    parsed = [jsonio.loads(json.dumps(v, separators=(",", ":"))) for v in values]
    rows = conn.execute(
        "SELECT octet_length(v::text) FROM unnest(%s::jsonb[]) WITH ORDINALITY AS x(v, i) ORDER BY i",
        ([Jsonb(v) for v in parsed],),
    ).fetchall()
    mismatches = [(v, n, jsonb_text_size(v)) for v, (n,) in zip(parsed, rows, strict=True) if n != jsonb_text_size(v)]
    assert mismatches == []
    # Compact JSON is not the measure: a list of small numbers is a third larger as jsonb text.
    ints = [1] * 1000
    assert jsonb_text_size(ints) == 3000 > len(json.dumps(ints, separators=(",", ":"))) == 2001


@pytest.mark.parametrize("number", ["1e+16", "1.5e-07", "-0.0", "0.1", "123456789.0", "5e-324", "-1e+300"])
def test_numeric_text_is_how_postgresql_prints_a_number(conn: psycopg.Connection, number: str) -> None:
    assert numeric_text(number) == scalar(conn, "SELECT %s::jsonb::text", (number,))


def _sized(size: int) -> dict[str, Any]:
    """Outputs of exactly ``size`` bytes of jsonb text, in several shapes."""
    count, rest = divmod(size, 3)
    ints = [1] * (count - 1) + [10**rest]  # "[1, 1, ..., 10]"
    text = "é" * ((size - 2) // 2) + "x" * ((size - 2) % 2)  # '"éé...x"': 2-byte characters
    floats_base = [1e16] * ((size - 2) // 19)  # "10000000000000000, " per element: compact JSON is 3 times smaller
    pad = size - jsonb_text_size([*floats_base, ""])
    floats = [*floats_base, "x" * pad]
    obj_base = {f"k{i}": i for i in range(1000)}
    obj = {**obj_base, "pad": "y" * (size - jsonb_text_size({**obj_base, "pad": ""}))}
    return {"ints": ints, "text": text, "floats": floats, "object": obj}


@pytest.mark.parametrize("shape", ["ints", "text", "floats", "object"])
def test_an_output_at_the_limit_passes_both_and_one_byte_over_fails_both(conn: psycopg.Connection, shape: str) -> None:
    at, over = _sized(MAX_OUTPUT_BYTES)[shape], _sized(MAX_OUTPUT_BYTES + 1)[shape]
    assert (jsonb_text_size(at), jsonb_text_size(over)) == (MAX_OUTPUT_BYTES, MAX_OUTPUT_BYTES + 1)
    assert scalar(conn, "SELECT octet_length(%s::jsonb::text)", (Jsonb(at),)) == MAX_OUTPUT_BYTES

    ok = check_result({"kind": "success", "output": at})
    assert ok == {"kind": "success", "output": at}
    assert sql_refusal(conn, ok) is None

    worker = check_result({"kind": "success", "output": over})
    assert (worker["kind"], worker["error_code"]) == ("permanent_failure", OUTPUT_TOO_LARGE)
    assert f"{MAX_OUTPUT_BYTES + 1} bytes" in worker["error_message"]
    server = sql_refusal(conn, {"kind": "success", "output": over})
    assert server == f"result output too large: output is {MAX_OUTPUT_BYTES + 1} bytes, over the 65536-byte limit"
    # What the worker sends instead is accepted.
    assert sql_refusal(conn, worker) is None


def test_error_code_and_message_at_the_limit_pass_both_and_are_trimmed_when_over(conn: psycopg.Connection) -> None:
    code_at, msg_at = "é" * MAX_ERROR_CODE_CHARS, "€" * (MAX_ERROR_MESSAGE_BYTES // 3) + "xx"  # 128 chars; 8192 bytes
    assert len(msg_at.encode()) == MAX_ERROR_MESSAGE_BYTES
    for kind in FAILURE_KINDS:
        result = {"kind": kind, "error_code": code_at, "error_message": msg_at}
        assert check_result(result) == result
        assert sql_refusal(conn, result) is None
        over = {"kind": kind, "error_code": code_at + "é", "error_message": msg_at + "x"}
        assert sql_refusal(conn, {**over, "error_message": msg_at}) == (
            "invalid result: error_code must be a string of at most 128 characters"
        )
        assert sql_refusal(conn, {**over, "error_code": code_at}) == (
            "invalid result: error_message must be a string of at most 8192 bytes"
        )
        fitted = check_result(over)  # the worker never sends more: it cuts both to their limit
        assert len(fitted["error_code"]) == MAX_ERROR_CODE_CHARS
        assert len(fitted["error_message"].encode()) <= MAX_ERROR_MESSAGE_BYTES
        assert fitted["error_message"].endswith("...")
        assert sql_refusal(conn, fitted) is None


def _nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


def _completions_body(output: Any) -> str:
    item = {"dispatch_id": "d", "lease_token": "t", "result": {"kind": "success", "output": output}}
    return json.dumps({"results": [item], "claim_slots": 1})


@pytest.mark.parametrize(
    "output",
    [
        _nested(MAX_OUTPUT_NESTING + 1),
        "a\x00b",
        {"\x00": 1},
        "\ud800",
        10**400,
        {1: "int key", "1": "the same key as JSON"},
    ],
    ids=["too-deep", "nul", "nul-key", "lone-surrogate", "huge-int", "duplicate-key"],
)
def test_what_the_gateway_refuses_the_worker_never_sends(output: Any) -> None:
    worker = check_result({"kind": "success", "output": output})
    assert (worker["kind"], worker["error_code"]) == ("permanent_failure", OUTPUT_NOT_JSON)
    with pytest.raises(ValueError):  # the gateway's reader refuses the body that would carry it: 400
        jsonio.loads(_completions_body(output))


def test_the_deepest_output_the_worker_sends_the_gateway_reads_in_every_route() -> None:
    deepest = _nested(MAX_OUTPUT_NESTING)
    assert check_result({"kind": "success", "output": deepest})["kind"] == "success"
    jsonio.loads(_completions_body(deepest))  # the deepest route: POST .../completions
    with pytest.raises(jsonio.RefusedJson):
        jsonio.loads(_completions_body(_nested(MAX_OUTPUT_NESTING + 1)))


def test_a_result_is_replaced_only_for_a_final_refusal_of_the_result() -> None:
    assert refuses_result(400, "invalid_request") and refuses_result(413, "payload_too_large")
    assert refuses_result(422, "http_422")
    for status, code in [(409, "lease_lost"), (409, "result_conflict"), (401, "worker_session_invalid")]:
        assert not refuses_result(status, code)
    assert not refuses_result(400, "worker_protocol_unsupported")
    assert not refuses_result(503, "unavailable") and not refuses_result(500, "internal_error")
    r = rejected(400, "invalid_request", "result output too large: " + "z" * 9000)
    assert (r["kind"], r["error_code"]) == ("permanent_failure", "result_rejected")
    assert r["error_message"].startswith("the server refused the result: 400 invalid_request: result output too large")
    assert len(r["error_message"].encode()) <= MAX_ERROR_MESSAGE_BYTES
