"""Re-run on the dashboard (docs/protocol.md, "Re-run") in Debian's Chromium against a real ``awp serve``
(python/awp/server/ui/actions.py ``retry_run``, templates/_run_summary.html, static/app.js):

- the summary of a failed run shows an operator Re-run (``data-rerun``) that asks to be confirmed
  (``data-rerun-confirm``) before anything changes, in place with the script and as a form without it; confirmed,
  the run is running again and its failed task ready (or queued);
- a viewer sees no button, and its POST is refused as its cancel is (python/tests/ui/test_ui.py); a running run shows
  none;
- a re-run of a run that is no longer failed or canceled (AWREQ) says so on the run page, never a 500.

Runs are made and driven in SQL (a worker registered with awp.register_worker fails the task). Every page is
watched (python/tests/ui/conftest.py, open_ui).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from ui_support import ui_post

from awp_testing.gateway import ServeProcess, wait_until

pytestmark = pytest.mark.usefixtures("no_live_runs")  # conftest.py: tests share one database


def run_status(c: psycopg.Connection[dict[str, Any]], run_id: str) -> str:
    row = c.execute("SELECT status FROM awp.get_run(%s)", (run_id,)).fetchone()
    assert row is not None
    return str(row["status"])


def task_status(c: psycopg.Connection[dict[str, Any]], run_id: str, key: str = "a") -> str:
    row = c.execute("SELECT status FROM awp.get_task(%s, %s)", (run_id, key)).fetchone()
    assert row is not None
    return str(row["status"])


def failed_run(db_dsn: str, wid: str) -> str:
    """A run of one mock task ``a``, failed: a worker driven in SQL claims ``a`` and fails it for good."""
    definition = {"id": wid, "tasks": [{"key": "a", "executor": "mock"}]}
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as c:
        c.execute("SELECT * FROM awp.create_workflow_version(%s)", (json.dumps(definition),))
        row = c.execute("SELECT awp.start_run(%s) AS run_id", (wid,)).fetchone()
        assert row is not None
        run_id: str = row["run_id"]
        worker = c.execute("SELECT * FROM awp.register_worker('ui-rerun', %s, %s)", (["mock"], 1)).fetchone()
        assert worker is not None
        me = (worker["worker_id"], worker["session_token"])
        leases: list[dict[str, Any]] = []

        def claimed() -> bool:
            c.execute("SELECT awp.coordinator_tick()")
            leases.extend(c.execute("SELECT * FROM awp.claim_tasks(%s, %s, 1)", me).fetchall())
            return bool(leases)

        wait_until(claimed, 15, 0.05, "a is claimed")
        lease = leases[0]
        assert lease["run_id"] == run_id and lease["task_key"] == "a"
        result = {"kind": "permanent_failure", "error_code": "x"}
        applied = c.execute(
            "SELECT awp.complete_task(%s, %s, %s, %s, %s) AS ok",
            (*me, lease["dispatch_id"], lease["lease_token"], json.dumps(result)),
        ).fetchone()
        assert applied is not None and applied["ok"] is True
        c.execute("SELECT awp.drain_worker(%s, %s)", me)  # takes no more work: a re-run task stays ready
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as c:
        wait_until(lambda: run_status(c, run_id) == "failed", 15, 0.05, "the run failed")
    return run_id


def test_the_operator_reruns_a_failed_run_after_confirming(
    gw: ServeProcess,
    db_dsn: str,
    sql: psycopg.Connection[dict[str, Any]],
    open_ui: Callable[..., Any],
) -> None:
    run_id = failed_run(db_dsn, "ui-rerun")
    page = open_ui("operator")
    page.goto(f"/ui/runs/{run_id}")
    page.evaluate("window.__sameDocument = true")
    summary = page.locator("#summary")
    rerun, confirm = summary.locator("[data-rerun]"), summary.locator("[data-rerun-confirm]")
    assert rerun.is_visible() and rerun.inner_text() == "Re-run"
    rerun.click()  # the first step only asks, in place
    confirm.wait_for()
    assert not rerun.is_visible() and page.evaluate("window.__sameDocument") is True
    assert run_status(sql, run_id) == "failed"
    summary.locator("[data-rerun-back]").click()  # Back: nothing changed, the button again
    rerun.wait_for()
    assert not confirm.is_visible() and page.evaluate("window.__sameDocument") is True
    rerun.dblclick()  # the second click falls on the confirmation's button: it confirms nothing
    confirm.wait_for()
    page.wait_for_timeout(300)
    assert run_status(sql, run_id) == "failed"
    confirm.click()
    page.wait_for_url(f"**/ui/runs/{run_id}")
    assert run_status(sql, run_id) == "running"
    assert task_status(sql, run_id) in ("ready", "queued")
    page.locator('#run-status[data-status="running"]').wait_for()
    assert summary.locator("[data-rerun]").count() == 0  # a live run: Cancel, no Re-run
    assert summary.get_by_role("button", name="Cancel").is_visible()


def test_without_the_script_both_steps_are_forms(
    gw: ServeProcess,
    db_dsn: str,
    sql: psycopg.Connection[dict[str, Any]],
    open_ui: Callable[..., Any],
) -> None:
    run_id = failed_run(db_dsn, "ui-rerun-noscript")
    page = open_ui("operator", script=False)
    page.goto(f"/ui/runs/{run_id}")
    page.locator("[data-rerun]").click()
    page.wait_for_url(f"**/ui/runs/{run_id}?rerun=confirm")
    assert page.locator("[data-rerun]").is_hidden() and run_status(sql, run_id) == "failed"  # asked, not done
    page.locator("[data-rerun-confirm]").click()
    page.wait_for_url(f"**/ui/runs/{run_id}")
    assert run_status(sql, run_id) == "running" and task_status(sql, run_id) in ("ready", "queued")
    assert page.locator("[data-rerun]").count() == 0
    page.goto(f"/ui/runs/{run_id}?rerun=confirm")  # a running run has no confirmation step either
    assert page.locator("[data-rerun-confirm]").count() == 0


def test_a_viewer_sees_no_button_and_its_post_is_refused(
    gw: ServeProcess,
    db_dsn: str,
    sql: psycopg.Connection[dict[str, Any]],
    open_ui: Callable[..., Any],
) -> None:
    run_id = failed_run(db_dsn, "ui-rerun-viewer")
    viewer = open_ui("viewer")
    viewer.goto(f"/ui/runs/{run_id}?rerun=confirm")
    assert viewer.locator("#run-status").inner_text() == "failed"
    assert viewer.locator("[data-rerun]").count() == 0 and viewer.locator("[data-rerun-confirm]").count() == 0
    csrf = viewer.locator("input[name=csrf_token]").first.get_attribute("value")
    path = f"/ui/runs/{run_id}/retry"
    r = ui_post(viewer, path, {"csrf_token": csrf, "confirmed": "yes"})
    assert r.status == 403 and "only the operator" in r.text()
    operator = open_ui("operator")
    operator.goto(f"/ui/runs/{run_id}")
    token = operator.locator("input[name=csrf_token]").first.get_attribute("value")
    assert ui_post(operator, path, {"confirmed": "yes"}).status == 403  # no CSRF token
    assert ui_post(operator, path, {"csrf_token": csrf, "confirmed": "yes"}).status == 403  # the viewer's
    forged = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
    assert ui_post(operator, path, {"csrf_token": token, "confirmed": "yes"}, forged).status == 403
    assert run_status(sql, run_id) == "failed"  # nothing changed


def test_a_second_rerun_says_the_run_is_no_longer_failed(
    gw: ServeProcess,
    db_dsn: str,
    sql: psycopg.Connection[dict[str, Any]],
    open_ui: Callable[..., Any],
) -> None:
    run_id = failed_run(db_dsn, "ui-rerun-twice")
    page = open_ui("operator")
    # The page has not heard of the re-run from elsewhere (its polls answer "unchanged"): confirming is refused.
    page.route("**/changes?*", lambda route: route.fulfill(json={"revision": 0, "status": "failed", "unchanged": True}))
    page.goto(f"/ui/runs/{run_id}")
    page.locator("[data-rerun]").click()
    sql.execute("SELECT * FROM awp.retry_run(%s)", (run_id,))  # someone else first
    page.locator("[data-rerun-confirm]").click()
    notice = page.locator("[data-rerun-notice=refused]")
    notice.wait_for()
    assert notice.get_attribute("role") == "alert"
    assert notice.inner_text().startswith("Not re-run: the run is running, not failed or canceled")
    assert page.url.endswith(f"/ui/runs/{run_id}?rerun=refused")
    page.unroute("**/changes?*")
    # The form posted again without the script: the same, not a 500; a link cannot make a failed run claim it.
    token = page.locator("input[name=csrf_token]").first.get_attribute("value")
    r = ui_post(page, f"/ui/runs/{run_id}/retry", {"csrf_token": token, "confirmed": "yes"})
    assert r.status == 303 and r.headers["location"] == f"/ui/runs/{run_id}?rerun=refused"
    other = failed_run(db_dsn, "ui-rerun-link")
    page.goto(f"/ui/runs/{other}?rerun=refused")
    assert page.locator("[data-rerun-notice]").count() == 0 and page.locator("[data-rerun]").is_visible()
    missing = ui_post(page, "/ui/runs/nope/retry", {"csrf_token": token, "confirmed": "yes"})
    assert missing.status == 404
