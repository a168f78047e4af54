"""The result of an attempt: its kinds, its limits and the one check of them that the worker, the gateway and the
database agree on (AWP issue 13).

The database enforces the limits (``awp._check_result`` in db/functions/complete_task.sql, and the CHECK
constraints of the attempt columns of ``awp.dispatches``, which ``awp.attempts`` reads); the gateway reads bodies
with the strict reader of :mod:`awp.protocol.jsonio` (at most :data:`awp.protocol.limits.BODY_LIMIT` bytes) and checks a
result's
shape against :data:`RESULT_KINDS`; the worker runs :func:`check_result` on every result before sending it, so
that what it sends is what the server accepts.
python/tests/integration/test_result_limits.py reads the limits from the database's catalog and compares them with the
constants here, and compares :func:`jsonb_text_size` with PostgreSQL's own measure.

Sizes are measured the database's way:

- an output: at most :data:`MAX_OUTPUT_BYTES` octets of its ``jsonb`` text, not of the compact JSON on the wire:
  ``[1, 2]`` and ``{"a": 1}`` (a space after each ``,`` and ``:``), numbers as ``numeric`` prints them (``1e+16``
  is ``10000000000000000``, ``1e-07`` is ``0.0000001``); nested at most :data:`MAX_OUTPUT_NESTING` levels (the
  strict reader's depth limit, counted from the deepest body that carries a result); no NUL, no lone surrogate,
  no number beyond a double's range, no duplicate key;
- an error message: at most :data:`MAX_ERROR_MESSAGE_BYTES` UTF-8 octets; an error code: at most
  :data:`MAX_ERROR_CODE_CHARS` characters (the worker trims both, and replaces NUL and lone surrogates).

A result the server still refuses with a final 4xx (:func:`refuses_result`) is reported once more as
:func:`rejected`: a ``permanent_failure`` with error code :data:`RESULT_REJECTED` and the server's message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from awp.protocol.jsonio import MAX_DEPTH, loads
from awp.protocol.wire import Result, ResultKind

RESULT_KINDS: Final[tuple[ResultKind, ...]] = ("success", "temporary_failure", "permanent_failure")
FAILURE_KINDS: Final[tuple[ResultKind, ...]] = RESULT_KINDS[1:]

MAX_OUTPUT_BYTES = 65536  # octet_length(output::text) of the jsonb value
MAX_ERROR_CODE_CHARS = 128  # length(error_code)
MAX_ERROR_MESSAGE_BYTES = 8192  # octet_length(error_message)
# The deepest body that carries an output: POST .../completions {results: [{result: {output: ...}}]} puts the
# output at level 5 of the strict reader's MAX_DEPTH levels (a single complete puts it at level 3).
MAX_OUTPUT_NESTING = MAX_DEPTH - 4

# Error codes of the results the worker itself makes.
OUTPUT_NOT_JSON = "output_not_json"  # not JSON, or JSON the server refuses (NUL, surrogate, range, depth)
OUTPUT_TOO_LARGE = "output_too_large"
INVALID_RESULT = "invalid_result"
RESULT_REJECTED = "result_rejected"  # the server refused the result with a final 4xx

# Final answers that refuse the result itself (400 invalid_request, 413 payload_too_large, a 422 of a proxy):
# sending the same result again cannot succeed. 409 (lease_lost, result_conflict), 401 and 5xx are not.
REFUSING_STATUSES = (400, 413, 422)
NOT_ABOUT_THE_RESULT = ("worker_protocol_unsupported",)

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def success(output: Any) -> Result:
    return {"kind": "success", "output": output}


def failure(kind: ResultKind, error_code: str, message: str, detail: str | None = None) -> Result:
    """A failure result within the limits: NUL and lone surrogates replaced (U+FFFD), the code cut to
    :data:`MAX_ERROR_CODE_CHARS` characters, the message to :data:`MAX_ERROR_MESSAGE_BYTES` bytes; ``detail`` (a
    traceback) kept as ``error_detail``, its last :data:`MAX_ERROR_MESSAGE_BYTES` bytes (a traceback ends with
    what matters)."""
    result: Result = {
        "kind": kind,
        "error_code": storable(error_code)[:MAX_ERROR_CODE_CHARS],
        "error_message": trim(storable(message)),
    }
    if detail:
        result["error_detail"] = tail(storable(detail))
    return result


def tail(text: str, limit: int = MAX_ERROR_MESSAGE_BYTES) -> str:
    """The end of ``text`` within ``limit`` UTF-8 bytes (whole characters), marked with "…" when cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return "…" + data[-(limit - len("…".encode())) :].decode("utf-8", errors="ignore")


def storable(text: str) -> str:
    """``text`` with what PostgreSQL text cannot hold (NUL, lone surrogates) replaced by U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", text)


def trim(text: str, limit: int = MAX_ERROR_MESSAGE_BYTES) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes (the database measures bytes)."""
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode("utf-8", errors="ignore") + "..."


def numeric_text(number: str) -> str:
    """How PostgreSQL's ``numeric`` prints a JSON number: positional notation, the scale of its input, no
    negative zero (``1e+16`` -> ``10000000000000000``, ``1.5e-07`` -> ``0.00000015``, ``-0.0`` -> ``0.0``)."""
    value = Decimal(number)
    text = format(value, "f")
    return text.lstrip("-") if value == 0 else text


def jsonb_text_size(value: Any) -> int:
    """``octet_length(value::jsonb::text)`` for a value as the gateway parsed it (dicts with string keys, lists,
    strings, ints, floats, booleans, None): PostgreSQL prints a jsonb value as ``json.dumps`` does with the
    separators ``", "`` and ``": "`` and without ASCII escapes, except its numbers (:func:`numeric_text`); the
    gateway hands floats to the database as ``repr`` prints them."""
    size = len(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")).encode("utf-8"))
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            text = repr(v)
            size += len(numeric_text(text)) - len(text)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return size


def output_problem(output: Any) -> tuple[str, str] | None:
    """(error code, message) when the server would refuse ``output``; None when it accepts it.

    The output is encoded as the worker's client encodes it, read back with the gateway's strict reader (so every
    refusal of the gateway is met here, and dict keys are what the server will see), and measured as the
    database measures it."""
    try:
        wire = json.dumps(output, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        parsed = loads(wire, max_depth=MAX_OUTPUT_NESTING)
    except (TypeError, ValueError, RecursionError) as e:
        return OUTPUT_NOT_JSON, f"the output is not JSON the server accepts: {e}"
    size = jsonb_text_size(parsed)
    if size > MAX_OUTPUT_BYTES:
        return OUTPUT_TOO_LARGE, f"the output is {size} bytes (of its jsonb text); the limit is {MAX_OUTPUT_BYTES}"
    return None


def check_result(result: Mapping[str, Any]) -> Result:
    """The result to send for what an executor returned: the same result when the server accepts it; a
    ``permanent_failure`` saying why (``output_not_json``, ``output_too_large``, ``invalid_result``) for an output
    it would refuse; a failure's code and message made to fit."""
    kind = result.get("kind", "temporary_failure")
    if kind == "success":
        output = result.get("output")
        problem = output_problem(output)
        if problem is not None:
            return failure("permanent_failure", *problem)
        return success(output)
    if kind not in FAILURE_KINDS:
        return failure("permanent_failure", INVALID_RESULT, f"unknown result kind {kind!r}")
    detail = result.get("error_detail")
    return failure(
        kind,
        str(result.get("error_code") or "error"),
        str(result.get("error_message") or ""),
        detail if isinstance(detail, str) else None,
    )


def refuses_result(status: int, code: str) -> bool:
    """True when an error answer to a completion refuses the result itself, for good."""
    return status in REFUSING_STATUSES and code not in NOT_ABOUT_THE_RESULT


def rejected(status: int, code: str, message: str) -> Result:
    """The permanent failure that replaces a result the server refused (sent once: never a loop)."""
    return failure("permanent_failure", RESULT_REJECTED, f"the server refused the result: {status} {code}: {message}")
