"""The protocol package's wire types match the database (issue 42): :class:`awp.protocol.wire.Lease` has the
columns of the composite type ``awp.lease``, in order, and a claimed lease carries exactly those keys."""

from __future__ import annotations

import typing

import psycopg

from awp.protocol import wire


def test_the_lease_type_has_the_columns_of_awp_lease(conn: psycopg.Connection) -> None:
    columns = [
        r[0]
        for r in conn.execute(
            "SELECT attname FROM pg_attribute"
            " WHERE attrelid = (SELECT typrelid FROM pg_type WHERE oid = 'awp.lease'::regtype)"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        )
    ]
    assert len(columns) >= 18
    assert list(wire.LEASE_FIELDS) == columns


def test_a_result_names_the_kinds_the_protocol_checks() -> None:
    from awp.protocol.results import RESULT_KINDS

    hints = typing.get_type_hints(wire.Result)
    assert typing.get_args(hints["kind"]) == RESULT_KINDS
