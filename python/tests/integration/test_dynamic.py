"""Dynamic workflows end to end (docs/dynamic.md): for_each over a list produced at run time, when conditions and
child runs, over HTTP with real worker processes and a real PostgreSQL; and two faults: kill -9 of a worker holding
an instance, kill -9 of the gateway while a for_each expands. Every instance runs to success exactly once."""

from __future__ import annotations

import time

import httpx
import pytest
from click.testing import CliRunner
from fault_support import assert_clean, query, start_registered, wait_run_db
from worker_support import (
    SHORT_LEASES,
    Workers,
    api,
    apply,
    get_run,
    mock_task,
    start_run,
    task,
    tasks,
    wait_run,
)

from awp.cli.main import main
from awp_testing.gateway import ServeProcess, serve, start_serve, wait_until

TEST_HANDLERS = "python/tests/handlers_for_tests.py"


GATEWAY_SETTINGS = SHORT_LEASES


def one_success_each(dsn: str, run_id: str) -> dict[str, int]:
    """{task key: its succeeded attempts} for every task of the run that a worker ran."""
    rows = query(
        dsn,
        "SELECT task_key, count(*) FILTER (WHERE status = 'succeeded') AS n FROM awp.attempts WHERE run_id = %s"
        " GROUP BY task_key",
        (run_id,),
    )
    return {r["task_key"]: r["n"] for r in rows}


def test_for_each_maps_a_list_made_at_run_time(gw: ServeProcess, workers: Workers, db_dsn: str) -> None:
    workers.start("dyn-mock", concurrency=4)
    chunks = ["intro", {"page": 2}, 3, None, "end"]
    definition = {
        "id": "dyn-chunks",
        "concurrency": 3,
        "tasks": [
            mock_task("split", output=chunks),
            mock_task("style", output={"tone": "short"}),
            {**mock_task("summarize", ["split", "style"], echo=True), "for_each": "split"},
            mock_task("merge", ["summarize"], echo=True),
        ],
    }
    run_id = start_run(gw, apply(gw, definition))
    run = wait_run(gw, run_id)
    assert run["status"] == "succeeded", tasks(gw, run_id)
    listed = tasks(gw, run_id)
    assert list(listed) == ["split", "style", "summarize", "merge", *[f"summarize[{i}]" for i in range(5)]]
    for i, chunk in enumerate(chunks):
        instance = listed[f"summarize[{i}]"]
        assert (instance["mapped_task"], instance["item_index"], instance["status"]) == ("summarize", i, "succeeded")
        output = task(gw, run_id, f"summarize[{i}]")["attempt_history"][-1]["output"]
        assert output["item"] == chunk and output["item_index"] == i
        assert output["upstream"] == {"style": {"tone": "short"}}  # not the list: its element is item
    mapped = task(gw, run_id, "summarize")
    assert (mapped["status"], mapped["item_count"], mapped["instances_succeeded"]) == ("succeeded", 5, 5)
    assert [o["item"] for o in mapped["output"]] == chunks
    merge = task(gw, run_id, "merge")["attempt_history"][-1]["output"]
    assert merge["upstream"] == {"summarize": mapped["output"]}
    assert one_success_each(db_dsn, run_id) == {
        "split": 1,
        "style": 1,
        "merge": 1,
        **{f"summarize[{i}]": 1 for i in range(5)},
    }
    assert query(db_dsn, "SELECT * FROM awp.check_invariants(ARRAY[%s])", (run_id,)) == []
    env = {"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": gw.tokens.operator, "COLUMNS": "200"}
    shown = CliRunner().invoke(main, ["run", "show", run_id], env=env, catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    table = shown.output[shown.output.index(" task ") :]  # the output line above shows the instances' outputs
    assert "succeeded 5/5 instances" in table and "summarize[0]" not in table, shown.output
    one = CliRunner().invoke(main, ["run", "task", run_id, "summarize[3]"], env=env, catch_exceptions=False)
    assert one.exit_code == 0 and "task summarize[3]" in one.output, one.output


def test_python_handlers_see_ctx_item(gw: ServeProcess, workers: Workers) -> None:
    workers.start("dyn-py", executors="mock,python", concurrency=2, extra=["--handlers", TEST_HANDLERS])
    definition = {
        "id": "dyn-py",
        "tasks": [
            mock_task("numbers", output=[1, 20, 300]),
            {
                "key": "double",
                "executor": "python",
                "action": "test-item",
                "depends_on": ["numbers"],
                "for_each": "numbers",
            },
        ],
    }
    run_id = start_run(gw, apply(gw, definition))
    run = wait_run(gw, run_id)
    assert run["status"] == "succeeded"
    assert run["output"] == {
        "double": [
            {"item": 1, "item_index": 0, "doubled": 2},
            {"item": 20, "item_index": 1, "doubled": 40},
            {"item": 300, "item_index": 2, "doubled": 600},
        ]
    }


def test_bad_lists_fail_the_mapped_task(gw: ServeProcess, workers: Workers) -> None:
    workers.start("dyn-bad", concurrency=2)
    for wf, output, max_items, message in [
        ("dyn-notlist", {"a": 1}, 1000, "for_each: the output of split is a JSON object, not an array"),
        ("dyn-toolong", [1, 2, 3], 2, "for_each: the output of split has 3 elements, over max_items 2"),
    ]:
        definition = {
            "id": wf,
            "tasks": [
                mock_task("split", output=output),
                {**mock_task("each", ["split"]), "for_each": "split", "max_items": max_items},
                mock_task("after", ["each"]),
            ],
        }
        run_id = start_run(gw, apply(gw, definition))
        assert wait_run(gw, run_id)["status"] == "failed"
        each = task(gw, run_id, "each")
        assert (each["status"], each["error_code"], each["error_message"]) == ("failed", "for_each_invalid", message)
        assert {k: t["status"] for k, t in tasks(gw, run_id).items()} == {
            "split": "succeeded",
            "each": "failed",
            "after": "skipped",
        }


def test_bad_definitions_are_refused_with_a_detail(gw: ServeProcess) -> None:
    cases = [
        ({"key": "b", "executor": "mock", "for_each": "a"}, "for_each names a, which is not one of its dependencies"),
        ({"key": "b", "executor": "mock", "depends_on": ["a"], "when": {"task": "a"}}, "exactly one of equals"),
        ({"key": "b", "executor": "mock", "depends_on": ["a"], "for_each": "a", "max_items": 0}, "max_items must be"),
        ({"key": "b", "executor": "workflow", "input": {}}, "input.workflow_id must be"),
    ]
    for bad, detail in cases:
        r = httpx.post(
            gw.api("/workflows"),
            json={"id": "dyn-refused", "tasks": [{"key": "a", "executor": "mock"}, bad]},
            headers={**gw.auth("operator"), "Idempotency-Key": f"bad-{time.monotonic_ns()}"},
            timeout=10,
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_request"
        assert detail in r.json()["error"]["message"], r.text


def test_when_branches_and_joins(gw: ServeProcess, workers: Workers) -> None:
    workers.start("dyn-when", concurrency=2)
    definition = {
        "id": "dyn-when",
        "tasks": [
            mock_task("classify", output={"label": "invoice", "score": 0.9}),
            {
                **mock_task("invoice", ["classify"], output="paid"),
                "when": {"task": "classify", "path": ["label"], "equals": "invoice"},
            },
            {
                **mock_task("other", ["classify"], output="filed"),
                "when": {"task": "classify", "path": ["label"], "not_equals": "invoice"},
            },
            mock_task("join", ["invoice", "other"], echo=True),
        ],
    }
    run_id = start_run(gw, apply(gw, definition))
    run = wait_run(gw, run_id)
    assert run["status"] == "succeeded"
    listed = tasks(gw, run_id)
    assert (listed["other"]["status"], listed["other"]["skip_reason"]) == ("skipped", "condition_false")
    assert listed["invoice"]["status"] == "succeeded"
    assert run["output"]["join"]["upstream"] == {"invoice": "paid", "other": None}
    events = api(gw, "GET", f"/runs/{run_id}/events?limit=100")["items"]
    assert any(
        e["entity_key"] == "other" and e["to_status"] == "skipped" and e["reason"] == "condition_false" for e in events
    )


def test_child_runs_link_both_ways(gw: ServeProcess, workers: Workers) -> None:
    workers.start("dyn-child", concurrency=2)
    apply(gw, {"id": "dyn-kid", "tasks": [mock_task("k", echo=True)]})
    definition = {
        "id": "dyn-parent",
        "tasks": [
            mock_task("prep", output={"doc": "d1"}),
            {"key": "sub", "executor": "workflow", "depends_on": ["prep"], "input": {"workflow_id": "dyn-kid"}},
            mock_task("after", ["sub"], echo=True),
        ],
    }
    run_id = start_run(gw, apply(gw, definition))
    run = wait_run(gw, run_id)
    assert run["status"] == "succeeded", tasks(gw, run_id)
    sub = task(gw, run_id, "sub")
    child = get_run(gw, sub["child_run_id"])
    assert (child["parent_run_id"], child["parent_task_key"], child["depth"]) == (run_id, "sub", 1)
    assert child["input"] == {"prep": {"doc": "d1"}}
    assert (
        sub["output"] == child["output"] == {"k": {"task": "k", "run_input": {"prep": {"doc": "d1"}}, "upstream": {}}}
    )
    assert run["output"]["after"]["upstream"] == {"sub": child["output"]}
    shown = CliRunner().invoke(
        main,
        ["run", "show", child["run_id"]],
        env={"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": gw.tokens.operator, "COLUMNS": "200"},
        catch_exceptions=False,
    )
    assert shown.exit_code == 0 and f"parent {run_id} (task sub)" in shown.output, shown.output


# ---- faults ------------------------------------------------------------------------------------------------


def instance_report(dsn: str, run_id: str, n: int) -> None:
    """Every instance of "each" exists once and succeeded exactly once; the run and the invariants are clean."""
    rows = query(
        dsn, "SELECT task_key, status, item_index FROM awp.run_tasks(%s) WHERE mapped_task = 'each'", (run_id,)
    )
    assert sorted(r["item_index"] for r in rows) == list(range(n))
    assert {r["status"] for r in rows} == {"succeeded"}
    successes = one_success_each(dsn, run_id)
    assert all(successes[f"each[{i}]"] == 1 for i in range(n)), successes
    assert_clean(dsn)


@pytest.mark.slow
def test_kill9_of_a_worker_holding_an_instance(fault_dsn: str) -> None:
    with serve(fault_dsn, coordinator_interval_ms=100) as gw, Workers(gw) as workers:
        procs, sessions = start_registered(workers, fault_dsn, ["dyn-k1", "dyn-k2"], concurrency=2)
        ids = {sessions[w.name]: w for w in procs}
        definition = {
            "id": "dyn-kill",
            "concurrency": 4,
            "tasks": [
                mock_task("split", output=list(range(8))),
                {**mock_task("each", ["split"], max_attempts=2, sleep_ms=600), "for_each": "split"},
            ],
        }
        run_id = start_run(gw, apply(gw, definition))
        held = wait_until(
            lambda: query(
                fault_dsn,
                "SELECT worker_id FROM awp.dispatches"
                " WHERE run_id = %s AND status = 'leased' AND task_key LIKE 'each[%%'",
                (run_id,),
            ),
            15,
            0.01,
            "an instance leased",
        )
        ids[held[0]["worker_id"]].kill()
        assert wait_run_db(fault_dsn, run_id, 60)["status"] == "succeeded"
        interrupted = query(
            fault_dsn, "SELECT count(*) AS n FROM awp.attempts WHERE run_id = %s AND status = 'interrupted'", (run_id,)
        )[0]["n"]
        assert interrupted >= 1, "the killed worker's instances were taken over"
        instance_report(fault_dsn, run_id, 8)


@pytest.mark.slow
def test_kill9_of_the_gateway_while_a_for_each_expands(fault_dsn: str) -> None:
    n = 3000
    gw = start_serve(fault_dsn, coordinator_interval_ms=100)
    tokens, port = gw.tokens, gw.port
    try:
        with Workers(None, gateway_url=gw.base_url, bootstrap=gw.tokens.bootstrap) as workers:
            start_registered(workers, fault_dsn, ["dyn-g1", "dyn-g2"], concurrency=8)
            definition = {
                "id": "dyn-gwkill",
                "concurrency": 16,
                "tasks": [
                    mock_task("split", output=list(range(n)), sleep_ms=800),
                    {**mock_task("each", ["split"], max_attempts=2), "for_each": "split", "max_items": n},
                ],
            }
            run_id = start_run(gw, apply(gw, definition))
            # The split's attempt runs for 800 ms; the gateway is killed about when its completion (and with it
            # the creation of 3,000 instances, one transaction) arrives. Whether the kill lands before, during or
            # after that transaction, the worker's completion is answered once (retried against the new gateway
            # when it was lost) and the instances are created once.
            started = wait_until(
                lambda: query(
                    fault_dsn, "SELECT started_at FROM awp.attempts WHERE run_id = %s AND task_key = 'split'", (run_id,)
                ),
                15,
                0.01,
                "split leased",
            )
            assert started
            time.sleep(0.78)
            gw.kill()
            gw = start_serve(fault_dsn, tokens=tokens, coordinator_interval_ms=100, port=port)
            assert wait_run_db(fault_dsn, run_id, 120)["status"] == "succeeded"
            assert one_success_each(fault_dsn, run_id)["split"] == 1
            instance_report(fault_dsn, run_id, n)
            mapped = query(fault_dsn, "SELECT item_count, output FROM awp.get_task(%s, 'each')", (run_id,))[0]
            assert mapped["item_count"] == n and len(mapped["output"]) == n
    finally:
        gw.stop()
