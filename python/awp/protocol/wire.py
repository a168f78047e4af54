"""The worker protocol's messages as types (docs/protocol.md, openapi.yaml): what a worker receives and sends.

:class:`Lease` is the SQL composite type ``awp.lease`` (db/functions/claim_tasks.sql) as JSON: one column, one
key, in the same order (python/tests/sql/test_protocol_wire.py compares them). Timestamps arrive as ISO 8601
text. :class:`Result` is an attempt's result (:mod:`awp.protocol.results` checks it)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

ResultKind = Literal["success", "temporary_failure", "permanent_failure"]


class Lease(TypedDict):
    """One lease handed to a worker by a claim or by a completion that claims (claim on complete)."""

    dispatch_id: str
    lease_token: str
    workflow_id: str
    workflow_version: int
    run_id: str
    task_key: str
    executor_kind: str
    action: str | None
    input: Any
    attempt: int
    attempt_deadline: str
    lease_expires_at: str
    lease_remaining_ms: int
    fencing_token: int
    run_input: Any
    upstream: Any
    item: Any
    item_index: int | None


class Result(TypedDict):
    """An attempt's result: ``kind`` and, by kind, an output or an error."""

    kind: ResultKind
    output: NotRequired[Any]
    error_code: NotRequired[str]
    error_message: NotRequired[str]
    error_detail: NotRequired[str]


class LeaseRef(TypedDict):
    """A lease named by its dispatch and secret token (heartbeats' ``leases`` and ``dropped``)."""

    dispatch_id: str
    lease_token: str


class OutputWrite(TypedDict, total=False):
    """Live output of a lease (docs/progress.md): the latest progress value, log lines and chunks, and the offset
    of its first line or chunk (a resend is deduplicated). A completion's ``live_output`` is a list of these."""

    progress: Any
    logs: list[str]
    chunks: list[str]
    offset: int


class ProgressItem(LeaseRef, OutputWrite):
    """One item of ``POST /workers/{id}/progress``: a lease's live output."""


class Completion(LeaseRef):
    """One item of ``POST /workers/{id}/completions``: a lease's result and its last live output."""

    result: Result
    live_output: NotRequired[list[OutputWrite]]


LEASE_FIELDS: tuple[str, ...] = tuple(Lease.__annotations__)
