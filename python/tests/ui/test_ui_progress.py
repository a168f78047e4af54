"""The dashboard's task panel shows a running task's log tail and latest progress live (docs/progress.md;
python/awp/server/ui/templates/_task.html, static/app.js, views.task_logs_part) in Debian's Chromium against a real
``awp serve`` and a real ``awp worker`` running a python handler that logs, emits and reports progress for a few
seconds: lines appear in the open panel while the task still runs, in order, and the progress follows. Every page is
watched (conftest.py's open_ui): a request to another origin, a console error or an uncaught exception fails
the test."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
from worker_support import Workers

from awp_testing.gateway import ServeProcess, wait_until

TEST_HANDLERS = "python/tests/handlers_for_tests.py"

# Counts the task panel's redraws (window.__panelRedraws) and notes whether its log tail was ever seen empty or gone
# after any change inside it (window.__tailBlinked): observers run after each script's changes, as the page is drawn.
BLINK_WATCH = """() => {
  const panel = document.querySelector('#task-panel');
  window.__tailBlinked = false;
  window.__panelRedraws = 0;
  new MutationObserver((records) => {
    if (records.some((r) => r.target === panel && r.type === 'childList')) window.__panelRedraws++;
    const tail = panel.querySelector('[data-log-tail]');
    if (!tail || !tail.textContent) window.__tailBlinked = true;
  }).observe(panel, {childList: true, subtree: true, characterData: true});
}"""


def task_status(db_dsn: str, run_id: str, key: str) -> str:
    with psycopg.connect(db_dsn) as c:
        row = c.execute("SELECT status FROM awp.tasks WHERE run_id = %s AND task_key = %s", (run_id, key)).fetchone()
    assert row is not None
    return str(row[0])


def test_the_task_panel_shows_the_log_tail_and_progress_live(
    gw: ServeProcess,
    workers: Workers,
    open_ui: Callable[..., Any],
    db_dsn: str,
) -> None:
    workers.start("ui-progress-w", executors="python", extra=["--handlers", TEST_HANDLERS])
    definition = {
        "id": "ui-progress",
        "tasks": [
            {
                "key": "gen",
                "executor": "python",
                "action": "test-stream",
                "input": {"chunks": 80, "interval_ms": 100, "log_every": 4},
                "timeout_ms": 60000,
            }
        ],
    }
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("SELECT * FROM awp.create_workflow_version(%s)", (json.dumps(definition),))
        row = c.execute("SELECT awp.start_run('ui-progress')").fetchone()
    assert row is not None
    run_id = str(row[0])
    wait_until(lambda: task_status(db_dsn, run_id, "gen") == "running", 15, 0.05, "the task runs")

    page = open_ui("viewer")
    page.goto(f"/ui/runs/{run_id}")
    page.locator('#dag [data-task-key="gen"]').click()
    panel = page.locator("#task-panel")
    tail = panel.locator("[data-log-tail]")
    tail.filter(has_text="line 0").wait_for()
    first = tail.inner_text()
    # From now on the tail is never seen empty, not even while the panel is redrawn at the task's end.
    page.evaluate(BLINK_WATCH)
    assert task_status(db_dsn, run_id, "gen") == "running", "the first line showed while the task ran"
    # More lines arrive in the open panel while the task still runs (no reload, no click).
    grown = wait_until(lambda: (t := tail.inner_text()).count("line ") > first.count("line ") and t, 10, 0.05, "more")
    assert task_status(db_dsn, run_id, "gen") == "running", "the tail grew while the task ran"
    assert grown.startswith(first)
    progress = panel.locator("[data-progress]")
    assert progress.is_visible() and '"of":80' in progress.inner_text().replace(" ", "")
    wait_until(lambda: task_status(db_dsn, run_id, "gen") == "succeeded", 30, 0.1, "the task ends")
    lines = [f"line {i}" for i in range(0, 80, 4)]

    def in_order() -> bool:
        text = tail.inner_text()
        positions = [text.find(line + "\n") if line != "line 76" else text.find(line) for line in lines]
        return all(p >= 0 for p in positions) and positions == sorted(positions)

    wait_until(in_order, 10, 0.1, "every line, in order")
    wait_until(lambda: page.evaluate("window.__panelRedraws") >= 1, 10, 0.1, "the panel is redrawn at the task's end")
    assert in_order()
    assert page.evaluate("window.__tailBlinked") is False, "the tail was empty for a moment"
    page.locator("#task-panel [data-progress]").filter(has_text='"done": 80').or_(
        page.locator("#task-panel [data-progress]").filter(has_text='"done":80')
    ).wait_for()
