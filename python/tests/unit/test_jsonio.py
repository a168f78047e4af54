"""The gateway's JSON writer (python/awp/protocol/jsonio.py): ``dumps_bytes`` (orjson) writes what the standard-library
``dumps`` writes, and falls back to it for what orjson refuses; the strict reader keeps its rules with its one
shared decoder. Unit tests: no server needed."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from awp.protocol.jsonio import dumps, dumps_bytes, loads
from awp.server.answers import json_response
from awp.server.middleware import new_request_id

UTC = dt.UTC

SAME_AS_STDLIB = {
    "lease-like": {
        "dispatch_id": "d_1",
        "input": {"a": [1, 2.5, None, True, "é ☃ \u2028"]},
        "attempt_deadline": dt.datetime(2026, 12, 4, 16, 52, 0, 123456, tzinfo=UTC),
        "lease_expires_at": dt.datetime(2026, 12, 4, 16, 52, tzinfo=UTC),  # no microseconds: none written
        "lease_remaining_ms": 30_000,
        "fencing_token": 2**63 - 1,
    },
    "date and naive time": {"day": dt.date(2026, 12, 4), "naive": dt.datetime(2026, 12, 4, 1, 2, 3)},
    "decimals": {"int": Decimal("12"), "frac": Decimal("1.5")},
    "floats": [0.1, 1e16, -0.0, 1.7976931348623157e308],
    "empty": {},
}


@pytest.mark.parametrize("name", sorted(SAME_AS_STDLIB))
def test_dumps_bytes_writes_what_dumps_writes(name: str) -> None:
    value = SAME_AS_STDLIB[name]
    assert dumps_bytes(value) == dumps(value).encode()


@pytest.mark.parametrize(
    "value",
    [
        {"big": 10**30},  # beyond 64 bits: orjson refuses it
        {"big": -(10**300)},
        {1: "an integer key"},  # orjson refuses keys that are not strings; json.dumps writes "1"
    ],
)
def test_dumps_bytes_falls_back_to_the_standard_library(value: object) -> None:
    written = dumps_bytes(value)
    assert written == dumps(value).encode()
    assert json.loads(written) == json.loads(dumps(value))


def test_dumps_bytes_refuses_what_is_not_json() -> None:
    with pytest.raises(TypeError):
        dumps_bytes({"x": object()})


def test_json_response_is_utf8_json() -> None:
    response = json_response({"s": "é"}, status=201)
    assert response.status == 201
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    assert response.body == '{"s":"é"}'.encode()


def test_loads_keeps_its_rules_with_one_shared_decoder() -> None:
    assert loads(b'{"a": {"b": [1, 2]}}') == {"a": {"b": [1, 2]}}
    for bad, message in ((b'{"a": 1, "a": 2}', "duplicate keys"), (b"[NaN]", "NaN"), (b"[1e400]", "out of range")):
        with pytest.raises(ValueError, match=message):
            loads(bad)
    assert loads(b'{"a": 1}') == {"a": 1}  # the shared decoder is not left in a bad state by a refusal


def test_request_ids_are_32_hex_digits_and_unique() -> None:
    ids = [new_request_id() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len({i[:20] for i in ids}) == 1  # one random prefix per process, then a counter
