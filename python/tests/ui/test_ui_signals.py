"""Approve and Reject on the dashboard (docs/waits.md) in Debian's Chromium against a real ``awp serve``
(python/awp/server/ui/actions.py ``signal_task``, templates/_task.html, static/app.js):

- the panel of a task waiting for a signal shows an operator Approve and Reject (``data-signal``); each asks to be
  confirmed (``data-signal-confirm``) before anything is sent, in place with the script and as a form without it;
- Approve ends the task with output ``{"approved": true}``; Reject with ``{"approved": false}``, and a task after it
  whose ``when`` wants an approval is skipped;
- a viewer sees no button, and its POST is refused as its cancel is (python/tests/ui/test_ui.py);
- a signal to a task that no longer waits (AWSIG, signal_not_waiting) says so in the panel, never a 500.

Runs are made and read in SQL (awp.create_workflow_version, awp.start_run, awp.get_task); the gateway's coordinator
starts the signal task. Every page is watched (conftest.py's open_ui): a request to another origin, a console
error or an uncaught exception fails the test.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from ui_support import ui_post

from awp_testing.gateway import ServeProcess, wait_until

APPROVAL_FLOW = [
    {"key": "approval", "executor": "signal"},
    {
        "key": "after",
        "executor": "mock",
        "depends_on": ["approval"],
        "when": {"task": "approval", "path": ["approved"], "equals": True},
    },
]


pytestmark = pytest.mark.usefixtures("no_live_runs")  # conftest.py: tests share one database


# Counts the replacements of the task panel's content (window.__swaps).
SWAPS = """window.__swaps = 0;
new MutationObserver(records => { for (const r of records) if (r.removedNodes.length) window.__swaps++; })
  .observe(document.querySelector('#task-panel'), {childList: true});"""


def start_waiting_run(sql: psycopg.Connection[dict[str, Any]], wid: str) -> str:
    """A run of ``approval`` (a signal task) then ``after`` (only when approved), once ``approval`` waits."""
    definition = {"id": wid, "tasks": APPROVAL_FLOW}
    sql.execute("SELECT * FROM awp.create_workflow_version(%s)", (json.dumps(definition),))
    row = sql.execute("SELECT awp.start_run(%s) AS run_id", (wid,)).fetchone()
    assert row is not None
    run_id: str = row["run_id"]
    wait_until(lambda: get_task(sql, run_id)["wait_reason"] == "waiting_signal", 15, 0.05, "the approval waits")
    return run_id


def get_task(sql: psycopg.Connection[dict[str, Any]], run_id: str, key: str = "approval") -> dict[str, Any]:
    row = sql.execute("SELECT * FROM awp.get_task(%s, %s)", (run_id, key)).fetchone()
    assert row is not None
    return row


def open_approval(page: Any, run_id: str) -> Any:
    """The run page, then the approval's panel opened from its node (by the script); the panel."""
    page.goto(f"/ui/runs/{run_id}")
    page.locator('#dag [data-task-key="approval"]').click()
    panel = page.locator("#task-panel")
    panel.locator("[data-reason=waiting_signal]").wait_for()
    return panel


def test_the_operator_approves_a_waiting_task_after_confirming(
    gw: ServeProcess, sql: psycopg.Connection[dict[str, Any]], open_ui: Callable[..., Any]
) -> None:
    run_id = start_waiting_run(sql, "ui-sig-approve")
    page = open_ui("operator")
    panel = open_approval(page, run_id)
    page.evaluate("window.__sameDocument = true")
    approve, reject = panel.locator("[data-signal=approve]"), panel.locator("[data-signal=reject]")
    assert approve.is_visible() and reject.is_visible()
    assert (approve.inner_text(), reject.inner_text()) == ("Approve", "Reject")
    approve.click()  # the first step only asks
    confirm = panel.locator("[data-signal-confirm=approve]")
    confirm.wait_for()
    assert not approve.is_visible() and '{"approved": true}' in panel.locator(".signal-confirm:visible").inner_text()
    assert get_task(sql, run_id)["status"] == "running"
    panel.locator("[data-signal-back]:visible").click()  # Back: nothing sent, the buttons again
    approve.wait_for()
    assert not confirm.is_visible() and get_task(sql, run_id)["status"] == "running"
    approve.dblclick()  # the second click falls on the confirmation's button: it confirms nothing
    confirm.wait_for()
    page.wait_for_timeout(300)
    assert get_task(sql, run_id)["status"] == "running"
    panel.locator("[data-signal-back]:visible").click()
    approve.click()
    page.evaluate(SWAPS)
    confirm.click()
    notice = panel.locator("[data-signal-notice=sent]")
    notice.wait_for()
    assert notice.inner_text().startswith("Approved:")
    task = get_task(sql, run_id)
    assert (task["status"], task["output"]) == ("succeeded", {"approved": True})
    assert panel.locator("[data-signal]").count() == 0  # it waits no more
    assert panel.locator(".badge").first.inner_text() == "succeeded"
    page.locator('#dag [data-task-key="approval"][data-status="succeeded"]').wait_for()  # the graph follows live
    # the panel is replaced twice: by the answer to the POST and by the live refresh after the task's events (in
    # either order); a refresh keeps the notice
    page.wait_for_function("window.__swaps >= 2")
    assert notice.is_visible() and notice.inner_text().startswith("Approved:")
    assert page.evaluate("window.__sameDocument") is True  # in place: the page was not reloaded


def test_the_operator_rejects_and_the_task_after_it_is_skipped(
    gw: ServeProcess, sql: psycopg.Connection[dict[str, Any]], open_ui: Callable[..., Any]
) -> None:
    run_id = start_waiting_run(sql, "ui-sig-reject")
    page = open_ui("operator")
    panel = open_approval(page, run_id)
    panel.locator("[data-signal=reject]").click()
    panel.locator("[data-signal-confirm=reject]").click()
    notice = panel.locator("[data-signal-notice=sent]")
    notice.wait_for()
    assert notice.inner_text().startswith("Rejected:") and '{"approved": false}' in notice.inner_text()
    task = get_task(sql, run_id)
    assert (task["status"], task["output"]) == ("succeeded", {"approved": False})
    sql.execute("SELECT awp.coordinator_tick()")  # the gateway's passes would do it as well
    after = wait_until(lambda: (t := get_task(sql, run_id, "after"))["status"] == "skipped" and t, 15, 0.05, "skip")
    assert after["skip_reason"] == "condition_false"
    row = sql.execute("SELECT status FROM awp.get_run(%s)", (run_id,)).fetchone()
    assert row is not None and row["status"] == "succeeded"  # a rejection is no failure
    node = page.locator('#dag [data-task-key="after"]')
    page.locator('#dag [data-task-key="after"][data-status="skipped"]').wait_for()
    assert node.get_attribute("data-skip-reason") == "condition_false"


def test_without_the_script_both_steps_are_forms(
    gw: ServeProcess, sql: psycopg.Connection[dict[str, Any]], open_ui: Callable[..., Any]
) -> None:
    run_id = start_waiting_run(sql, "ui-sig-noscript")
    page = open_ui("operator", script=False)
    page.goto(f"/ui/runs/{run_id}?task=approval")
    panel = page.locator("#task-panel")
    panel.locator("[data-signal=approve]").click()
    page.wait_for_url(f"**/ui/runs/{run_id}?task=approval&confirm=approve")
    assert panel.locator("[data-signal=approve]").is_hidden()
    assert get_task(sql, run_id)["status"] == "running"  # asked, not sent
    panel.locator("[data-signal-confirm=approve]").click()
    page.wait_for_url(f"**/ui/runs/{run_id}?task=approval&sent=approve")
    assert panel.locator("[data-signal-notice=sent]").inner_text().startswith("Approved:")
    assert get_task(sql, run_id)["output"] == {"approved": True}
    page.reload()  # the notice holds only while the task bears it out: here it does
    assert panel.locator("[data-signal-notice=sent]").is_visible()
    page.goto(f"/ui/runs/{run_id}?task=approval&sent=reject")  # a link cannot make the panel claim a rejection
    assert panel.locator("[data-signal-notice]").count() == 0


def test_a_viewer_sees_no_buttons_and_its_post_is_refused(
    gw: ServeProcess, sql: psycopg.Connection[dict[str, Any]], open_ui: Callable[..., Any]
) -> None:
    run_id = start_waiting_run(sql, "ui-sig-viewer")
    viewer = open_ui("viewer")
    panel = open_approval(viewer, run_id)
    assert panel.locator("[data-signal]").count() == 0 and panel.locator("[data-signal-box]").count() == 0
    viewer.goto(f"/ui/runs/{run_id}?task=approval&confirm=approve")
    assert panel.locator("[data-signal-confirm]").count() == 0
    csrf = viewer.locator("input[name=csrf_token]").first.get_attribute("value")
    path = f"/ui/runs/{run_id}/tasks/approval/signal"
    form = {"csrf_token": csrf, "signal": "approve", "confirmed": "yes"}
    r = ui_post(viewer, path, form)
    assert r.status == 403 and "only the operator" in r.text()
    operator = open_ui("operator")
    operator.goto(f"/ui/runs/{run_id}?task=approval")
    token = operator.locator("input[name=csrf_token]").first.get_attribute("value")
    assert ui_post(operator, path, {**form, "csrf_token": ""}).status == 403  # no CSRF token
    assert ui_post(operator, path, form).status == 403  # the viewer's
    forged = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
    assert ui_post(operator, path, {**form, "csrf_token": token}, forged).status == 403
    assert ui_post(operator, path, {**form, "csrf_token": token, "signal": "maybe"}).status == 400
    task = get_task(sql, run_id)
    assert (task["status"], task["wait_reason"]) == ("running", "waiting_signal")  # nothing was sent


def test_a_second_approve_says_the_task_no_longer_waits(
    gw: ServeProcess, sql: psycopg.Connection[dict[str, Any]], open_ui: Callable[..., Any]
) -> None:
    signal = 'SELECT * FROM awp.send_signal(%s, \'approval\', \'{"approved": true, "by": "sql"}\')'
    page = open_ui("operator")
    # A signal from elsewhere while the confirmation step is open: the live page shows the task succeeded, and
    # its buttons are gone.
    live_run = start_waiting_run(sql, "ui-sig-live")
    panel = open_approval(page, live_run)
    panel.locator("[data-signal=approve]").click()
    panel.locator("[data-signal-confirm=approve]").wait_for()
    sql.execute(signal, (live_run,))
    panel.locator('.badge[data-status="succeeded"]').wait_for()
    assert panel.locator("[data-signal-confirm]").count() == 0 and panel.locator("[data-signal]").count() == 0
    # The same before the page has heard of it (its polls answered "unchanged"): confirming then is refused.
    run_id = start_waiting_run(sql, "ui-sig-twice")
    page.route(
        "**/changes?*", lambda route: route.fulfill(json={"revision": 0, "status": "running", "unchanged": True})
    )
    panel = open_approval(page, run_id)
    panel.locator("[data-signal=approve]").click()  # the confirmation step, open in this tab...
    sql.execute(signal, (run_id,))
    panel.locator("[data-signal-confirm=approve]").click()  # ...confirmed after someone else signalled
    notice = panel.locator("[data-signal-notice=refused]")
    notice.wait_for()
    assert notice.get_attribute("role") == "alert"
    assert notice.inner_text().startswith(
        "Not approved: the task is not waiting for a signal (its status is succeeded)"
    )
    assert get_task(sql, run_id)["output"] == {"approved": True, "by": "sql"}  # unchanged
    page.unroute("**/changes?*")
    # The form posted again without the script: to the panel with the same message, not a 500.
    token = page.locator("input[name=csrf_token]").first.get_attribute("value")
    form = {"csrf_token": token, "signal": "approve", "confirmed": "yes"}
    path = f"/ui/runs/{run_id}/tasks/approval/signal"
    r = ui_post(page, path, form)
    assert r.status == 303 and r.headers["location"] == f"/ui/runs/{run_id}?task=approval&refused=approve"
    page.goto(r.headers["location"])
    assert "Not approved: the task is not waiting for a signal" in panel.locator("[role=alert]").inner_text()
    fragment = ui_post(page, path, {**form, "fragment": "1"})  # as the script posts it
    assert fragment.status == 200 and 'data-signal-notice="refused"' in fragment.text()
    missing = ui_post(page, f"/ui/runs/{run_id}/tasks/nope/signal", form)
    assert missing.status == 404 and "no task nope" in missing.text()
