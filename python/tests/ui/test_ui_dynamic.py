"""The dashboard's run page for dynamic workflows (docs/dynamic.md) in Debian's Chromium against a real ``awp serve``
(python/awp/server/ui/runview.py, dag.py, templates/run.html and _task.html, static/app.js):

- a mapped (``for_each``) task is one node of the graph with a count badge "succeeded/instances", kept live; its
  instances are no nodes, its task panel lists them 50 at a time (next and previous, with and without the script);
- a task that started a child run links to the child from its panel, and the child's page links back to its parent;
- a task skipped because its ``when`` condition was false is marked apart from one skipped because a dependency
  failed;
- the page of a run with 3,000 instances draws its three nodes, in bounded time and weight.

The runs are driven in SQL (as python/tests/sql/test_invariants.py does): a worker registered with awp.register_worker
claims what the coordinator dispatched to it and reports the results the test chooses, so every status is known.
Every page is watched (conftest.py's open_ui): a request to another origin, a console error or an uncaught
exception fails the test.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from awp.protocol.statuses import TASK_STATUSES
from awp.server.ui.render import INSTANCES_PAGE, run_task_url, status_text
from awp.server.ui.runview import run_view
from awp_testing.gateway import ServeProcess, wait_until

PAGE = INSTANCES_PAGE  # instances per page of the task panel (50)


# Long leases and heartbeat windows: the SQL workers below never heartbeat, and a test lasts well under a minute.
GATEWAY_SETTINGS = {"lease_duration_ms": 300000, "heartbeat_interval_ms": 60000}
# Every live run is canceled after each test (but the 3,000-instance one: the module's database is dropped next).
pytestmark = pytest.mark.usefixtures("no_live_runs")
KEEP_LIVE_WORKFLOWS = ("ui-wide",)


class SqlWorker:
    """A worker session driven in SQL: it claims what a coordinator pass (the gateway's, or its own
    ``awp.coordinator_tick``) dispatched to it, and completes each lease with the result the test gives."""

    def __init__(self, dsn: str, kinds: list[str], slots: int) -> None:
        self.db = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
        row = self.db.execute("SELECT * FROM awp.register_worker('ui-sql', %s, %s)", (kinds, slots)).fetchone()
        assert row is not None
        self.worker = (row["worker_id"], row["session_token"])
        self.slots = slots
        self.held = 0

    def claim(self, n: int, timeout: float = 15.0) -> dict[str, dict[str, Any]]:
        """``n`` new leases, by task key."""
        got: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(got) < n:
            assert time.monotonic() < deadline, f"only {sorted(got)} of {n} leases in {timeout}s"
            self.db.execute("SELECT awp.coordinator_tick()")
            want = min(n - len(got), self.slots - self.held)
            for lease in self.db.execute("SELECT * FROM awp.claim_tasks(%s, %s, %s)", (*self.worker, want)):
                got[lease["task_key"]] = lease
                self.held += 1
            if len(got) < n:
                time.sleep(0.05)
        return got

    def complete(self, lease: dict[str, Any], output: Any = None, fail: bool = False) -> None:
        result = {"kind": "permanent_failure", "error_code": "boom"} if fail else {"kind": "success", "output": output}
        applied = self.db.execute(
            "SELECT awp.complete_task(%s, %s, %s, %s, %s) AS ok",
            (*self.worker, lease["dispatch_id"], lease["lease_token"], json.dumps(result)),
        ).fetchone()
        assert applied is not None and applied["ok"] is True
        self.held -= 1

    def drain(self) -> None:
        """Take no new work (the leases held are still completed)."""
        self.db.execute("SELECT awp.drain_worker(%s, %s)", self.worker)

    def close(self) -> None:
        self.db.close()


@pytest.fixture
def sql_worker(db_dsn: str) -> Iterator[Callable[[list[str], int], SqlWorker]]:
    made: list[SqlWorker] = []

    def make(kinds: list[str], slots: int) -> SqlWorker:
        made.append(SqlWorker(db_dsn, kinds, slots))
        return made[-1]

    yield make
    for w in made:
        with contextlib.suppress(psycopg.Error):  # already stopped (drained with no lease left)
            w.drain()  # nothing more is dispatched to it
        w.close()


def start(db_dsn: str, definition: dict[str, Any]) -> str:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("SELECT * FROM awp.create_workflow_version(%s)", (json.dumps(definition),))
        row = c.execute("SELECT awp.start_run(%s)", (definition["id"],)).fetchone()
    assert row is not None
    return str(row[0])


def run_row(db_dsn: str, run_id: str) -> dict[str, Any]:
    with psycopg.connect(db_dsn, row_factory=dict_row) as c:
        row = c.execute("SELECT * FROM awp.get_run(%s)", (run_id,)).fetchone()
    assert row is not None
    return row


def keys(locator: Any) -> list[str]:
    return [str(e.get_attribute("data-task-key")) for e in locator.all()]


def mapped_run(wid: str, items_executor: str = "python", max_items: int | None = None) -> dict[str, Any]:
    """split -> each (for_each over split's output) -> after."""
    each: dict[str, Any] = {"key": "each", "executor": items_executor, "depends_on": ["split"], "for_each": "split"}
    if max_items is not None:
        each["max_items"] = max_items
    return {
        "id": wid,
        "concurrency": 200,
        "tasks": [
            {"key": "split", "executor": "mock"},
            each,
            {"key": "after", "executor": "mock", "depends_on": ["each"]},
        ],
    }


# -- for_each ----------------------------------------------------------------------------------------------


def test_a_mapped_task_is_one_node_with_a_live_count_and_a_paged_list_of_its_instances(
    gw: ServeProcess, db_dsn: str, open_ui: Callable[..., Any], sql_worker: Callable[[list[str], int], SqlWorker]
) -> None:
    n, done = 120, 45
    run_id = start(db_dsn, mapped_run("ui-map"))
    worker = sql_worker(["mock", "python"], done)
    page = open_ui("viewer")
    page.goto(f"/ui/runs/{run_id}")
    page.evaluate("window.__sameDocument = true")
    node = page.locator('#dag [data-task-key="each"]')
    badge = node.locator(".badge")
    assert node.count() == 1 and badge.count() == 0  # nothing to count before the list exists

    # split returns the list: the instances appear on the open page as the mapped node's count, never as nodes
    worker.complete(worker.claim(1)["split"], output=list(range(n)))
    page.wait_for_selector(f'#dag [data-task-key="each"] .badge[data-instances="0/{n}"]', timeout=5_000)
    leases = worker.claim(done)
    assert sorted(leases) == sorted(f"each[{i}]" for i in range(done))  # dispatched in index order
    worker.drain()  # no more: the other instances stay ready
    for i in range(done):
        worker.complete(leases[f"each[{i}]"], output={"doubled": 2 * i})
    page.wait_for_selector(f'#dag [data-task-key="each"] .badge[data-instances="{done}/{n}"]', timeout=5_000)
    assert badge.text_content() == f"{done}/{n}"
    assert f"{done} of {n} instances succeeded" in str(node.get_attribute("aria-label"))
    assert page.locator('#dag [data-task-key="each[0]"]').count() == 0
    assert keys(page.locator("#dag [data-task-key]")) == ["split", "each", "after"]
    assert page.evaluate("window.__sameDocument") is True  # all of it live, no reload

    page.reload()  # the server draws the same
    page.evaluate("window.__sameDocument = true")
    assert badge.text_content() == f"{done}/{n}" and badge.get_attribute("data-instances") == f"{done}/{n}"
    assert page.locator("#dag [data-task-key]").count() == 3
    assert page.locator("#dag a.node").count() == 3 and page.locator("#dag path.edge").count() == 2

    # its task panel lists the instances, a page at a time
    node.click()
    panel = page.locator("#task-panel")
    rows = panel.locator("table.instances tbody tr[data-task-key]")
    panel.locator("h2", has_text="each").wait_for()
    assert keys(rows) == [f"each[{i}]" for i in range(PAGE)]
    statuses = [r.get_attribute("data-status") for r in rows.all()]
    assert statuses[:done] == ["succeeded"] * done and "succeeded" not in statuses[done:]
    assert panel.locator("[data-instance-count]").inner_text() == f"{done} of {n} succeeded"
    assert "page 1 of 3" in panel.locator("nav.pager").first.inner_text()
    assert panel.locator("a[rel=prev]").count() == 0
    row = panel.locator('tr[data-task-key="each[3]"]')
    assert "succeeded" in row.inner_text() and row.locator("a[data-task-link='each[3]']").count() == 1

    panel.locator("a[rel=next]").first.click()
    panel.locator("table.instances[data-page='2']").wait_for()
    assert keys(rows) == [f"each[{i}]" for i in range(PAGE, 2 * PAGE)]
    assert "ipage=2" in page.url and "task=each" in page.url
    assert page.evaluate("document.activeElement.id") == "instances-h"
    panel.locator("a[rel=next]").first.click()
    panel.locator("table.instances[data-page='3']").wait_for()
    assert keys(rows) == [f"each[{i}]" for i in range(2 * PAGE, n)]  # the last 20
    assert panel.locator("a[rel=next]").count() == 0
    assert "page 3 of 3" in panel.locator("nav.pager").first.inner_text()
    panel.locator("a[rel=prev]").first.click()
    panel.locator("table.instances[data-page='2']").wait_for()
    assert keys(rows)[0] == f"each[{PAGE}]"

    # an instance's own panel, and back to its page of the list
    panel.locator("a[data-task-link='each[53]']").click()
    panel.locator("h2", has_text="each[53]").wait_for()
    assert "ready" in panel.locator(".facts .badge").first.inner_text()
    assert "53" in panel.locator("pre.json").first.inner_text()  # its item
    assert "task=each%5B53%5D" in page.url and "ipage" not in page.url
    back = panel.locator("a[data-mapped-task='each']")
    assert back.get_attribute("data-ipage") == "2"
    back.click()
    panel.locator("table.instances[data-page='2']").wait_for()
    page.keyboard.press("Escape")
    assert panel.is_hidden() and page.evaluate("document.activeElement.dataset.taskKey") == "each"
    assert page.evaluate("window.__sameDocument") is True

    # without the script: the server renders the panel on the page asked for, and the links lead there
    page.goto(f"/ui/runs/{run_id}?task=each&ipage=3")
    assert panel.is_visible() and keys(rows)[0] == f"each[{2 * PAGE}]"
    assert panel.locator("a[rel=prev]").first.get_attribute("href") == f"/ui/runs/{run_id}?task=each&ipage=2"
    assert rows.first.locator("a").get_attribute("href") == f"/ui/runs/{run_id}?task=each%5B{2 * PAGE}%5D"
    part = page.context.request.get(f"/ui/runs/{run_id}/tasks/each?ipage=99")  # past the last page: the last
    assert part.status == 200 and 'data-page="3"' in part.text()
    part = page.context.request.get(f"/ui/runs/{run_id}/tasks/each?ipage=%C2%B2")  # not a number: the first
    assert part.status == 200 and 'data-page="1"' in part.text()
    done_one = page.context.request.get(f"/ui/runs/{run_id}/tasks/each%5B0%5D")
    assert done_one.status == 200 and "&#34;doubled&#34;: 0" in done_one.text()  # its output


# -- when conditions and child runs -------------------------------------------------------------------------


def test_a_condition_skip_is_marked_apart_and_child_and_parent_runs_link_to_each_other(
    gw: ServeProcess, db_dsn: str, open_ui: Callable[..., Any], sql_worker: Callable[[list[str], int], SqlWorker]
) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        kid = {"id": "ui-kid", "tasks": [{"key": "k", "executor": "mock"}]}
        c.execute("SELECT * FROM awp.create_workflow_version(%s)", (json.dumps(kid),))
    run_id = start(
        db_dsn,
        {
            "id": "ui-parent",
            "tasks": [
                {"key": "prep", "executor": "mock"},
                {"key": "yes", "executor": "mock", "depends_on": ["prep"], "when": _when("a")},
                {"key": "no", "executor": "mock", "depends_on": ["prep"], "when": _when("b")},
                {"key": "sub", "executor": "workflow", "depends_on": ["prep"], "input": {"workflow_id": "ui-kid"}},
                {"key": "bad", "executor": "mock"},
                {"key": "after-bad", "executor": "mock", "depends_on": ["bad"]},
            ],
        },
    )
    worker = sql_worker(["mock"], 10)
    page = open_ui("viewer")
    page.goto(f"/ui/runs/{run_id}")
    page.evaluate("window.__sameDocument = true")
    roots = worker.claim(2)
    worker.complete(roots["prep"], output={"label": "a"})
    worker.complete(roots["bad"], fail=True)
    rest = worker.claim(2)  # yes, and the child run's k
    assert sorted(rest) == ["k", "yes"]
    for lease in rest.values():
        worker.complete(lease, output={"ok": True})
    wait_until(lambda: run_row(db_dsn, run_id)["status"] == "failed", 15, 0.05, "the parent run to end")

    # followed live: the two skips differ
    no, after_bad = page.locator('#dag [data-task-key="no"]'), page.locator('#dag [data-task-key="after-bad"]')
    page.wait_for_selector('#dag [data-task-key="no"][data-skip-reason="condition_false"]', timeout=5_000)
    page.wait_for_selector('#dag [data-task-key="after-bad"][data-skip-reason="dependency_failed"]', timeout=5_000)
    assert no.get_attribute("aria-label") == "no: skipped (condition false)"
    assert after_bad.get_attribute("aria-label") == "after-bad: skipped (dependency failed)"
    assert page.evaluate("window.__sameDocument") is True
    page.reload()  # and drawn so by the server
    assert no.get_attribute("data-skip-reason") == "condition_false"
    assert no.get_attribute("aria-label") == "no: skipped (condition false)"
    assert "skipped (condition false)" in no.locator("title").text_content()
    assert after_bad.get_attribute("data-skip-reason") == "dependency_failed"
    assert page.locator('#dag [data-task-key="yes"]').get_attribute("data-skip-reason") is None
    no.click()
    panel = page.locator("#task-panel")
    panel.locator("h2", has_text="no").wait_for()
    status = panel.locator(".facts .badge").first
    assert status.inner_text() == "skipped (condition false)"
    assert status.get_attribute("data-skip-reason") == "condition_false"

    # the child-run task's panel links to the child, whose page links back
    page.locator('#dag [data-task-key="sub"]').click()
    panel.locator("h2", has_text="sub").wait_for()
    child_link = panel.locator("a[data-child-run]")
    child_id = str(child_link.get_attribute("data-child-run"))
    child = run_row(db_dsn, child_id)
    assert (child["parent_run_id"], child["parent_task_key"], child["status"]) == (run_id, "sub", "succeeded")
    assert child_link.get_attribute("href") == f"/ui/runs/{child_id}"
    child_link.click()
    page.wait_for_url(gw.url(f"/ui/runs/{child_id}"))
    parent = page.locator(f'[data-parent-run="{run_id}"]')
    assert " ".join(parent.inner_text().split()) == f"child of {run_id} (task sub)"
    assert page.locator("[data-parent-run]").count() == 1
    parent.locator(f'a[href="/ui/runs/{run_id}"]').click()
    page.wait_for_url(gw.url(f"/ui/runs/{run_id}"))
    assert page.locator("[data-parent-run]").count() == 0  # a top-level run names no parent
    page.goto(f"/ui/runs/{child_id}")
    page.locator(f'[data-parent-run="{run_id}"] a[href*="task=sub"]').click()  # to the parent, its task open
    page.wait_for_url(re.compile(re.escape(gw.url(f"/ui/runs/{run_id}?task=sub"))))
    assert page.locator("#task-panel a[data-child-run]").get_attribute("data-child-run") == child_id


def _when(label: str) -> dict[str, Any]:
    return {"task": "prep", "path": ["label"], "equals": label}


# -- a wide run --------------------------------------------------------------------------------------------


def test_the_page_of_a_run_with_3000_instances_draws_three_nodes_in_bounded_time(
    gw: ServeProcess, db_dsn: str, open_ui: Callable[..., Any], sql_worker: Callable[[list[str], int], SqlWorker]
) -> None:
    n = 3000
    run_id = start(db_dsn, mapped_run("ui-wide", max_items=n))  # its instances are python's: no worker runs them
    worker = sql_worker(["mock"], 1)
    worker.complete(worker.claim(1)["split"], output=list(range(n)))
    assert run_row(db_dsn, run_id)["task_counts"]["ready"] == n
    page = open_ui("viewer")
    started = time.monotonic()
    response = page.goto(f"/ui/runs/{run_id}")
    assert response is not None and response.status == 200
    loaded = time.monotonic() - started
    html = response.text()
    longest = page.evaluate("window.__longest")
    print(f"{n} instances: page loaded in {loaded:.2f}s, {len(html) / 1000:.0f} kB, longest task {longest:.0f} ms")
    assert loaded < 15, f"the page took {loaded:.1f}s"
    assert len(html) < 120_000, f"the page weighs {len(html)} bytes"  # no instance drawn: their statuses only
    assert keys(page.locator("#dag [data-task-key]")) == ["split", "each", "after"]
    assert page.locator('#dag [data-task-key="each"] .badge').get_attribute("data-instances") == f"0/{n}"
    assert page.locator("[data-task-key^='each[']").count() == 0
    assert longest < 3000, f"the main thread was busy for {longest:.0f} ms at once"

    page.locator('#dag [data-task-key="each"]').click()
    rows = page.locator("#task-panel table.instances tbody tr[data-task-key]")
    page.locator("#task-panel table.instances[data-page='1']").wait_for()
    assert rows.count() == PAGE and keys(rows)[0] == "each[0]"
    assert f"page 1 of {n // PAGE}" in page.locator("#task-panel nav.pager").first.inner_text()
    t0 = time.monotonic()
    last = page.context.request.get(f"/ui/runs/{run_id}/tasks/each?ipage={n // PAGE}")
    took = time.monotonic() - t0
    print(f"{n} instances: their last page in {took * 1000:.0f} ms")
    assert last.status == 200 and took < 5
    listed = re.findall(r'<tr data-task-key="(each\[\d+\])"', last.text())
    assert listed == [f"each[{i}]" for i in range(n - PAGE, n)]


# -- pure layout -------------------------------------------------------------------------------------------


def test_instances_are_counted_not_drawn_and_skips_say_why() -> None:
    def row(key: str, status: str, **extra: Any) -> dict[str, Any]:
        return {"task_key": key, "status": status, "depends_on": ["split"] if key != "split" else [], **extra}

    mapped_key = "a-mapped-task-with-a-long-key"
    rows = [
        row("split", "succeeded"),
        row(mapped_key, "waiting_dependencies", item_count=40, instances_succeeded=12),
        row("no", "skipped", skip_reason="condition_false"),
    ]
    for i in range(40):
        rows.append(row(f"{mapped_key}[{i}]", "succeeded" if i < 12 else "ready", mapped_task=mapped_key, item_index=i))
    view = run_view(rows, 0, None)
    nodes = {n.key: n for n in view.drawing.nodes}
    assert list(nodes) == ["split", mapped_key, "no"] and view.total == 3
    assert (nodes[mapped_key].badge, nodes[mapped_key].label) == ("12/40", "a-mapped-…")  # shortened beside it
    assert nodes["split"].badge == "" and nodes["no"].skip_reason == "condition_false"
    digit = {s: "0123456789"[i] for i, s in enumerate(TASK_STATUSES)}
    assert view.instances == {mapped_key: digit["succeeded"] * 12 + digit["ready"] * 28}
    assert status_text("skipped", "condition_false") == "skipped (condition false)"
    assert status_text("skipped", "dependency_failed") == "skipped (dependency failed)"
    assert status_text("waiting_dependencies", None) == "waiting dependencies"
    assert run_task_url("r 1", "each[3]", 1) == "/ui/runs/r%201?task=each%5B3%5D&ipage=2"
