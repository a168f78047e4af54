"""Unit tests of the worker's pieces that need no gateway: executors, handlers, deadlines, backoff, what a
completion does with an error answer."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from awp.handlers import Context, PermanentError, handler, unregister
from awp.protocol.wire import Lease
from awp.worker.acklog import AckLog
from awp.worker.backoff import Backoff
from awp.worker.client import Client, GatewayError
from awp.worker.completer import Completer, completion_verdict
from awp.worker.config import WorkerConfig
from awp.worker.executions import Execution
from awp.worker.executors import MockExecutor, PythonExecutor, build_executors, check_result, load_handler_module
from awp.worker.heartbeats import Heartbeats
from awp.worker.ledger import Ledger
from awp.worker.session import Session


def make_ctx(attempt: int = 1, deadline_s: float = 10.0) -> Context:
    return Context(
        run_id="run_1",
        task_key="t1",
        attempt=attempt,
        fencing_token=7,
        workflow_id="wf",
        action="a",
        deadline=time.monotonic() + deadline_s,
    )


async def test_mock_succeeds_with_default_output() -> None:
    result = await MockExecutor().execute("extract", {}, make_ctx(attempt=2))
    assert result == {"kind": "success", "output": {"task": "t1", "action": "extract", "attempt": 2}}


async def test_mock_returns_given_output_and_sleeps() -> None:
    start = time.monotonic()
    result = await MockExecutor().execute("a", {"sleep_ms": 50, "output": [1, 2]}, make_ctx())
    assert result == {"kind": "success", "output": [1, 2]}
    assert time.monotonic() - start >= 0.045


async def test_mock_fail_attempts_fails_while_attempt_at_most_n() -> None:
    ex = MockExecutor()
    assert (await ex.execute("a", {"fail_attempts": 2}, make_ctx(1)))["kind"] == "temporary_failure"
    assert (await ex.execute("a", {"fail_attempts": 2}, make_ctx(2)))["kind"] == "temporary_failure"
    assert (await ex.execute("a", {"fail_attempts": 2}, make_ctx(3)))["kind"] == "success"


async def test_mock_fail_kinds() -> None:
    ex = MockExecutor()
    temp = await ex.execute("a", {"fail": "temporary"}, make_ctx())
    perm = await ex.execute("a", {"fail": "permanent"}, make_ctx())
    assert temp["kind"] == "temporary_failure"
    assert perm["kind"] == "permanent_failure"
    assert perm["error_code"] == "mock_permanent"


async def test_python_unknown_action_is_permanent_failure() -> None:
    result = await PythonExecutor().execute("no-such-action-xyz", {}, make_ctx())
    assert result["kind"] == "permanent_failure"
    assert result["error_code"] == "unknown_action"


async def test_python_handlers_sync_async_errors() -> None:
    seen: list[Context] = []

    @handler("unit-async")
    async def h_async(input: Any, ctx: Context) -> dict[str, Any]:
        seen.append(ctx)
        return {"got": input["x"], "key": ctx.idempotency_key}

    @handler("unit-sync")
    def h_sync(input: Any, ctx: Context) -> int:
        return input["x"] * 2

    @handler("unit-boom")
    def h_boom(input: Any, ctx: Context) -> None:
        raise RuntimeError("x" * 20000)

    @handler("unit-perm")
    async def h_perm(input: Any, ctx: Context) -> None:
        raise PermanentError("bad input", error_code="bad_input")

    try:
        ex = PythonExecutor()
        assert await ex.execute("unit-async", {"x": 1}, make_ctx()) == {
            "kind": "success",
            "output": {"got": 1, "key": "run_1:t1"},
        }
        assert seen[0].fencing_token == 7 and seen[0].remaining() > 5
        assert await ex.execute("unit-sync", {"x": 21}, make_ctx()) == {"kind": "success", "output": 42}
        boom = await ex.execute("unit-boom", {}, make_ctx())
        assert boom["kind"] == "temporary_failure" and boom["error_code"] == "handler_error"
        assert boom["error_message"].startswith("RuntimeError(") and len(boom["error_message"].encode()) <= 8192
        perm = await ex.execute("unit-perm", {}, make_ctx())
        assert perm.pop("error_detail").rstrip().endswith("bad input")  # the traceback (AWP issue 41)
        assert perm == {"kind": "permanent_failure", "error_code": "bad_input", "error_message": "bad input"}
    finally:
        for name in ("unit-async", "unit-sync", "unit-boom", "unit-perm"):
            unregister(name)


def test_handler_name_registered_twice_is_rejected() -> None:
    @handler("unit-dup")
    def one(input: Any, ctx: Context) -> None: ...

    try:
        with pytest.raises(ValueError, match="already has a handler"):

            @handler("unit-dup")
            def two(input: Any, ctx: Context) -> None: ...
    finally:
        unregister("unit-dup")


def test_output_over_64k_is_permanent_failure() -> None:
    big = check_result({"kind": "success", "output": "x" * (64 * 1024)})
    assert big["kind"] == "permanent_failure" and big["error_code"] == "output_too_large"
    ok = check_result({"kind": "success", "output": "x" * 1000})
    assert ok["kind"] == "success"
    odd = check_result({"kind": "success", "output": {1, 2}})
    assert odd["kind"] == "permanent_failure"


def test_unknown_executor_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown executor"):
        build_executors(["mock", "shell"])


def test_example_handlers_load_from_a_file_path() -> None:
    module = load_handler_module("examples/handlers.py")
    assert hasattr(module, "summarize")


def _lease(remaining_ms: int, attempt_after_lease_s: float, dispatch_id: str = "d1") -> Lease:
    return {
        "dispatch_id": dispatch_id,
        "lease_token": f"tok-{dispatch_id}",
        "workflow_id": "wf",
        "workflow_version": 1,
        "run_id": "r",
        "task_key": f"t-{dispatch_id}",
        "executor_kind": "mock",
        "action": None,
        "input": {},
        "attempt": 1,
        "attempt_deadline": f"2026-01-01T00:00:{10 + attempt_after_lease_s:06.3f}+00:00",
        "lease_expires_at": "2026-01-01T00:00:10+00:00",
        "lease_remaining_ms": remaining_ms,
        "fencing_token": 1,
        "run_input": {},
        "upstream": {},
        "item": None,
        "item_index": None,
    }


async def test_local_deadline_uses_durations_margin_and_attempt_deadline() -> None:
    t0 = 1000.0
    ex = Execution(_lease(2000, 3.0), t0)
    ex.set_margin(300)
    assert ex.attempt_deadline == pytest.approx(t0 + 5.0)
    assert ex.deadline == pytest.approx(t0 + 1.7)
    ex.renew(2000, t0 + 1.0)  # renewed: lease ends 2 s after the heartbeat was sent
    assert ex.deadline == pytest.approx(t0 + 2.7)
    ex.renew(500, t0 + 1.1)  # an older answer never moves it back
    assert ex.deadline == pytest.approx(t0 + 2.7)
    ex.renew(2000, t0 + 4.5)  # never past the attempt deadline (minus the margin)
    assert ex.deadline == pytest.approx(t0 + 4.7)


def test_backoff_has_full_jitter_and_a_cap() -> None:
    b = Backoff(100, 1000)
    delays = [b.next_delay() for _ in range(20)]
    assert all(0 <= d <= 1.0 for d in delays)
    assert max(delays[5:]) > 0.1
    b.reset()
    assert b.next_delay() <= 0.1


async def test_cancelled_async_handler_stops() -> None:
    @handler("unit-slow")
    async def slow(input: Any, ctx: Context) -> None:
        await asyncio.sleep(30)

    try:
        task = asyncio.create_task(PythonExecutor().execute("unit-slow", {}, make_ctx()))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        unregister("unit-slow")


@pytest.mark.parametrize(
    ("status", "code", "verdict"),
    [
        (401, "worker_session_invalid", "session"),
        (409, "lease_lost", "drop"),
        (409, "result_conflict", "drop"),
        (400, "invalid_request", "replace"),
        (413, "payload_too_large", "replace"),
        (400, "worker_protocol_unsupported", "drop"),
        (404, "not_found", "drop"),  # the single path retried this five times, the batch path dropped it at once
        (403, "forbidden", "drop"),
        (429, "too_many_requests", "retry"),
        (503, "database_unavailable", "retry"),
        (500, "internal_error", "retry"),
    ],
)
def test_a_completion_error_gets_one_verdict_on_both_paths(status: int, code: str, verdict: str) -> None:
    """One rule for a single completion and a batch (one path: ``Completer.send``, a single result being a batch of
    one)."""
    assert completion_verdict(GatewayError(status, code, "m")) == verdict


class ScriptedGateway(Client):
    """A client whose requests are recorded (path, body) and answered from a script: an answer, or an error raised."""

    def __init__(self, *answers: Any) -> None:
        super().__init__("http://gateway.invalid")
        self.answers = list(answers)
        self.sent: list[tuple[str, Any]] = []

    async def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        self.sent.append((path, json.loads(json.dumps(body))))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def completer_of(gateway: ScriptedGateway, concurrency: int) -> tuple[Completer, Ledger, list[Lease]]:
    """A completer on ``gateway`` (registered as w1) and the leases it hands to no waiting slot."""
    ledger = Ledger()
    session = Session(WorkerConfig("http://gateway.invalid", "boot", concurrency=concurrency), gateway, ledger)
    session.worker_id, session.session_token = "w1", "s1"
    started: list[Lease] = []
    return Completer(session, Heartbeats(session), lambda lease, _: started.append(lease)), ledger, started


def running(ledger: Ledger, dispatch_id: str) -> Execution:
    ex = Execution(_lease(60_000, 60.0, dispatch_id), time.monotonic())
    ledger.start(ex)
    return ex


async def test_a_single_result_is_a_batch_of_one_on_its_leases_route(tmp_path: Path) -> None:
    """Without batching, one result goes at once on its lease's own route, asking for one lease for its slot."""
    gateway = ScriptedGateway({"applied": True, "leases": [_lease(60_000, 60.0, "d2")]})
    completer, ledger, started = completer_of(gateway, concurrency=1)
    completer.ack_log = AckLog(str(tmp_path / "acks.jsonl"))
    ex = running(ledger, "d1")
    leases = await completer.complete(ex, {"kind": "success", "output": 1})
    assert [lease["dispatch_id"] for lease in leases] == ["d2"] and started == []
    assert gateway.sent == [
        (
            "/workers/w1/leases/d1/complete",
            {"lease_token": "tok-d1", "result": {"kind": "success", "output": 1}, "claim_slots": 1, "claim_seq": 1},
        )
    ]
    assert ex.settled and completer.acknowledged == 1 and ledger.claims_pending == set()
    assert ledger.in_hand == {"d2": leases[0]}  # listed in heartbeats until its slot starts it
    ack = json.loads((tmp_path / "acks.jsonl").read_text())
    assert ack == {
        "dispatch_id": "d1",
        "run_id": "r",
        "task_key": "t-d1",
        "attempt": 1,
        "fencing_token": 1,
        "kind": "success",
        "applied": True,
    }


async def test_a_batch_of_one_sends_a_refused_result_again_once_as_result_rejected() -> None:
    refused = GatewayError(400, "invalid_request", "output too large")
    gateway = ScriptedGateway(refused, refused)
    completer, ledger, _ = completer_of(gateway, concurrency=1)
    ex = running(ledger, "d1")
    assert await completer.complete(ex, {"kind": "success", "output": "x"}) == []
    assert [body["result"]["kind"] for _, body in gateway.sent] == ["success", "permanent_failure"]
    assert gateway.sent[1][1]["result"]["error_code"] == "result_rejected"
    assert completer.rejected == 1 and not ex.settled  # never a loop: the replacement refused too is dropped


async def test_batched_results_go_together_and_a_refused_one_is_replaced() -> None:
    """With batching even one result uses the completions route; a result refused within a batch answer is sent
    again as result_rejected, and each slot gets a lease of the answer."""
    gateway = ScriptedGateway(
        {
            "results": [
                {"dispatch_id": "d1", "applied": True},
                {"dispatch_id": "d2", "error": {"code": "invalid_request", "message": "too large"}},
            ],
            "leases": [_lease(60_000, 60.0, "d3")],
        },
        {"results": [{"dispatch_id": "d2", "applied": True}], "leases": []},
    )
    completer, ledger, _ = completer_of(gateway, concurrency=2)
    loop = asyncio.create_task(completer.loop())
    try:
        one, two = running(ledger, "d1"), running(ledger, "d2")
        got = await asyncio.gather(
            completer.complete(one, {"kind": "success", "output": 1}),
            completer.complete(two, {"kind": "success", "output": 2}),
        )
    finally:
        loop.cancel()
    assert [[lease["dispatch_id"] for lease in leases] for leases in got] == [["d3"], []]
    assert [path for path, _ in gateway.sent] == ["/workers/w1/completions"] * 2
    first, again = (body for _, body in gateway.sent)
    assert [r["dispatch_id"] for r in first["results"]] == ["d1", "d2"] and first["claim_slots"] == 2
    assert [r["result"]["error_code"] for r in again["results"]] == ["result_rejected"] and "claim_slots" not in again
    assert one.settled and two.settled and completer.acknowledged == 2 and completer.rejected == 1
