"""The dashboard through a PL/Proxy router (issue 43, part 3; docs/scale-out.md): one ``awp serve`` on the router's
DSN with ``--shard-url`` for each of two shard clusters, Debian's Chromium. The runs list merges both shards newest
first, a run page of either shard shows its DAG live to succeeded, the workers page shows the one worker that serves
both, and a cancel from the dashboard reaches the run's shard."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from shard_support import Sharded, sharded
from worker_support import Workers, apply, get_run, start_run

from awp_testing.gateway import ServeProcess, Tokens, start_serve, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env() -> Iterator[Sharded]:
    with sharded(2) as e:
        yield e


@pytest.fixture(scope="module")
def gw(env: Sharded) -> Iterator[ServeProcess]:
    args = [a for d in env.shard_gateways for a in ("--shard-url", d)]
    g = start_serve(env.router_gateway, tokens=Tokens(), args=args)
    try:
        yield g
    finally:
        g.stop()


def shard_of(run_id: str) -> int:
    return int(run_id[17:19], 16)


def test_the_dashboard_shows_and_acts_on_runs_of_both_shards(gw: ServeProcess, open_ui: Any) -> None:
    quick = apply(
        gw,
        {
            "id": "ui-sharded",
            "tasks": [{"key": "a", "executor": "mock"}, {"key": "b", "executor": "mock", "depends_on": ["a"]}],
        },
    )
    stuck = apply(gw, {"id": "ui-sharded-waits", "tasks": [{"key": "t0", "executor": "python"}]})
    runs = [start_run(gw, quick) for _ in range(12)]
    assert {shard_of(r) for r in runs} == {0, 1}, runs
    with Workers(gw) as workers:
        workers.start("ui-w", concurrency=2)

        def all_succeeded() -> bool:
            return all(get_run(gw, r)["status"] == "succeeded" for r in runs)

        wait_until(all_succeeded, 60, 0.2, "every run to succeed")
        page = open_ui("operator")
        page.goto("/ui/runs")
        shown = page.locator("tr[data-run-id]").evaluate_all("rows => rows.map(r => r.dataset.runId)")
        assert set(runs) <= set(shown), shown  # both shards' runs in one list
        newest_first = [r for r in shown if r in runs]
        assert newest_first == sorted(newest_first, reverse=True)  # run ids begin with their time
        for r in (next(x for x in runs if shard_of(x) == 0), next(x for x in runs if shard_of(x) == 1)):
            page.goto(f"/ui/runs/{r}")
            assert page.locator("#run-status").inner_text() == "succeeded"
            assert page.locator("#dag [data-task-key]").count() == 2
        page.goto("/ui/workers")
        assert page.locator("tr[data-worker-id]").count() == 1  # one worker, serving both shards
        waiting = next(r for r in (start_run(gw, stuck) for _ in range(8)) if shard_of(r) == 1)
        page.goto(f"/ui/runs/{waiting}")
        page.get_by_role("button", name="Cancel", exact=True).click()
        page.get_by_role("button", name="Yes, cancel the run").click()
        page.wait_for_url(gw.url(f"/ui/runs/{waiting}"))
        assert get_run(gw, waiting)["status"] == "canceled"
