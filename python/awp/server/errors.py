"""The one table from database errors to HTTP answers, and the error the gateway raises.

Functions in schema ``awp`` raise our own SQLSTATEs (the SQL API in docs/sql-api.md); callers branch on the SQLSTATE,
never on message text. Anything else from the database is a bug or an outage: a lost connection, a request pool
with no free connection, and a ``lock_timeout`` or ``statement_timeout`` that ended a statement are
``503 unavailable`` (with ``Retry-After``: the same request may be sent again); every other error is
``500 internal_error`` (logged with its cause, never shown).
"""

from __future__ import annotations

import re

import psycopg
import psycopg_pool

# SQLSTATE -> (HTTP status, error code)
SQLSTATE_ERRORS: dict[str, tuple[int, str]] = {
    "AWREQ": (400, "invalid_request"),
    "AWPRO": (400, "worker_protocol_unsupported"),
    "AWSES": (401, "worker_session_invalid"),
    "AWNTF": (404, "not_found"),
    "AWDRN": (409, "worker_draining"),
    "AWCAP": (409, "worker_capacity_exceeded"),
    "AWLST": (409, "lease_lost"),
    "AWCNF": (409, "result_conflict"),
    "AWIDM": (409, "idempotency_conflict"),
    "AWSIG": (409, "signal_not_waiting"),
    "AWBIG": (413, "payload_too_large"),
}

# Codes the gateway itself answers with (python/awp/openapi.yaml), by HTTP status.
GATEWAY_ERRORS: dict[int, str] = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "idempotency_conflict",
    413: "payload_too_large",
    500: "internal_error",
    503: "unavailable",
}

# A live connection whose statement waited too long (docs/operations.md, Timeouts and pools): the database is up,
# but a lock it needed was held elsewhere (lock_timeout: 55P03 lock_not_available) or the statement ran past
# statement_timeout (57014 query_canceled, also a DBA's pg_cancel_backend). Answered 503: retry later.
TIMEOUT_SQLSTATES: dict[str, str] = {
    "55P03": "the request waited too long for a lock held by another transaction (lock_timeout); retry later",
    "57014": "the statement was canceled (statement_timeout or an operator); retry later",
}

# Seconds in the Retry-After header of every 503 answer.
RETRY_AFTER_S = 1

ERROR_CODES: frozenset[str] = frozenset(code for _, code in SQLSTATE_ERRORS.values()) | frozenset(
    GATEWAY_ERRORS.values()
)


class ApiError(Exception):
    """An error the gateway answers with: a body ``{"error": {"code", "message", "request_id"}}`` (a client
    receives it as an :class:`awp.worker.client.GatewayError`)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    @classmethod
    def of(cls, status: int, message: str) -> ApiError:
        """A gateway error with the standard code for ``status``."""
        return cls(status, GATEWAY_ERRORS[status], message)


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` means the database cannot be reached right now (answer 503, retry later)."""
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg.OperationalError | psycopg.InterfaceError):
        sqlstate = getattr(exc, "sqlstate", None)
        # 57014 query_canceled / 55P03 lock_not_available are OperationalErrors of a live connection.
        return sqlstate is None or sqlstate.startswith(("08", "57P"))
    return False


def is_timeout_error(exc: BaseException) -> bool:
    """True when ``exc`` is a statement ended by lock_timeout or statement_timeout (the connection is fine)."""
    return getattr(exc, "sqlstate", None) in TIMEOUT_SQLSTATES


def from_database_error(exc: psycopg.Error | psycopg_pool.PoolTimeout) -> ApiError | None:
    """The API error for one of our SQLSTATEs, ``503 unavailable`` for a lost database or a timeout, else None."""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate in TIMEOUT_SQLSTATES:
        return ApiError.of(503, TIMEOUT_SQLSTATES[sqlstate])
    if sqlstate in SQLSTATE_ERRORS:
        diag = getattr(exc, "diag", None)
        primary = diag.message_primary if diag is not None else None
        detail = diag.message_detail if diag is not None else None
        return from_sqlstate(sqlstate, *unwrap_remote(primary, detail))
    if is_connection_error(exc) or is_shard_unreachable(exc):
        return ApiError.of(503, "the database is unavailable; retry later")
    return None


# Behind a PL/Proxy router (docs/scale-out.md) a shard's error comes back with its SQLSTATE, and with its message
# and detail wrapped: "awp.get_run(1): [awp] REMOTE ERROR: run not found" / "Remote detail: no run x".
_REMOTE_PRIMARY = re.compile(r"^\S+\(\d+\): \[[^\]]*\] REMOTE \w+: ")
_REMOTE_DETAIL = "Remote detail: "
# A shard PL/Proxy could not reach (connection refused or lost, timeouts): PL/Proxy's own error, XX000, such as
# "PL/Proxy function awp.get_run(1): [awp] PQconnectPoll: connection to server ... failed" (the router's
# awp_router.unreachable, db/router/20_wrappers.sql, knows the same messages).
_SHARD_UNREACHABLE = re.compile(
    r"\S+\(\d+\): (\[[^\]]*\] (PQconnectPoll|PQconnectStart|PQconsumeInput|PQflush|PQsendQuery)"
    r"|connect timeout to|query timeout|Lost result|Unfinished connection)"
)


def unwrap_remote(primary: str | None, detail: str | None) -> tuple[str | None, str | None]:
    """A shard's own message and detail out of PL/Proxy's wrapping (unchanged when not wrapped)."""
    if primary is not None:
        primary = _REMOTE_PRIMARY.sub("", primary, count=1)
    if detail is not None and detail.startswith(_REMOTE_DETAIL):
        detail = detail[len(_REMOTE_DETAIL) :]
    return primary, detail


def is_shard_unreachable(exc: BaseException) -> bool:
    """True for PL/Proxy's error about a shard it cannot reach (the router answers 503 for it, as for its own)."""
    diag = getattr(exc, "diag", None)
    primary = diag.message_primary if diag is not None else None
    return getattr(exc, "sqlstate", None) == "XX000" and bool(primary and _SHARD_UNREACHABLE.search(primary))


def from_sqlstate(sqlstate: str, primary: str | None, detail: str | None) -> ApiError:
    """The API error for one of our SQLSTATEs (``SQLSTATE_ERRORS``) with the database's message and detail."""
    status, code = SQLSTATE_ERRORS[sqlstate]
    return ApiError(status, code, join_message(primary or code, detail))


def join_message(primary: str, detail: str | None) -> str:
    """``primary: detail``, without repeating the primary message when the detail already starts with it
    (``dependency cycle`` + ``dependency cycle: a -> a`` is ``dependency cycle: a -> a``)."""
    if not detail or detail == primary:
        return primary
    if detail.startswith(primary + ":"):
        return detail
    return f"{primary}: {detail}"
