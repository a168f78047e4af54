"""The run page's layout in a real headless Chromium (with test_ui.py's gateway settings and workers):

- the demo's DAG (examples/demo-etl.yaml, seven layers) is drawn in one row: every edge goes left to right;
- Cancel asks first (as Re-run does, python/tests/ui/test_ui_rerun.py), in place with the page's script and by a
  redirect to the confirmation step without it;
- an open task drawer shows its whole attempts table (the Error column) and leaves the run's Cancel clickable;
- the run summary fits a 420 px wide window.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from worker_support import Workers, apply, get_run, mock_task, start_run

from awp_testing.gateway import ServeProcess, wait_until

DEMO = Path(__file__).resolve().parents[3] / "examples" / "demo-etl.yaml"
# test_ui.py's gateway and workers (conftest.py's fixtures); every live run is canceled after each test.
GATEWAY_SETTINGS = {"lease_duration_ms": 10000, "heartbeat_interval_ms": 1000}
DRAIN_WORKERS = False
pytestmark = pytest.mark.usefixtures("no_live_runs")

# Each edge's start and end x (the path's first and last points) and each node's box, from the drawn SVG.
EDGES_AND_NODES = """() => {
  const edges = [...document.querySelectorAll('#dag path.edge')].map(p => {
    const n = p.getAttribute('d').match(/-?[0-9.]+/g).map(Number);
    return {from: p.dataset.from, to: p.dataset.to, x1: n[0], x2: n[n.length - 2]};
  });
  const nodes = {};
  document.querySelectorAll('#dag [data-task-key] rect').forEach(r => {
    nodes[r.parentElement.dataset.taskKey] = {x: +r.getAttribute('x'), w: +r.getAttribute('width')};
  });
  return {edges, nodes};
}"""

# Whether the element is what the browser finds at its own centre (nothing covers it).
ON_TOP = """(el) => {
  const r = el.getBoundingClientRect();
  const hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
  return hit === el || el.contains(hit);
}"""
ON_TOP_AND_BOX = """(el) => {
  const r = el.getBoundingClientRect();
  const hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
  return {on_top: hit === el || el.contains(hit), height: r.height, right: r.right};
}"""
# The open drawer's measures in one evaluation (the page reloads the panel's content when an event of its task
# arrives, so an element a locator found may be gone a moment later): each attempt's last cell, scrolled into view,
# and the drawer's box; whether the drawer scrolls sideways; the attempts table's right edge against the drawer's.
DRAWER_FIT = """() => {
  const d = document.querySelector('#task-panel');
  const w = d && d.querySelector('.attempts-wrap');
  if (!d || d.hidden || !w) return null;
  const cells = [...d.querySelectorAll('.attempts tbody.attempt > tr:first-child > td:last-child')].map(c => {
    c.scrollIntoView({block: 'nearest', inline: 'nearest'});
    const r = c.getBoundingClientRect(), b = d.getBoundingClientRect();
    return {left: r.left, right: r.right, box_left: b.left, box_right: b.right};
  });
  const b = d.getBoundingClientRect();
  return {cells, sideways: d.scrollWidth > d.clientWidth, wrap_right: w.getBoundingClientRect().right,
          box: {x: b.left, right: b.right}, text: d.querySelector('.attempts').innerText};
}"""


def _demo_run(db_dsn: str) -> str:
    definition = yaml.safe_load(DEMO.read_text())
    with psycopg.connect(db_dsn, autocommit=True) as c:
        created = c.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps(definition)]).fetchone()
        assert created
        row = c.execute("SELECT awp.start_run(%s, %s)", [created[0], created[1]]).fetchone()
    assert row
    return str(row[0])


def test_the_demo_dag_is_drawn_in_one_row_every_edge_left_to_right(
    gw: ServeProcess,
    open_ui: Callable[..., Any],
    db_dsn: str,
) -> None:
    run_id = _demo_run(db_dsn)
    page = open_ui("operator")
    page.goto(f"/ui/runs/{run_id}")
    drawn = page.evaluate(EDGES_AND_NODES)
    edges, nodes = drawn["edges"], drawn["nodes"]
    assert len(nodes) == len(yaml.safe_load(DEMO.read_text())["tasks"])
    assert edges and len(edges) >= len(nodes) - 1
    backwards = [e for e in edges if not e["x1"] < e["x2"]]
    assert not backwards, backwards
    for e in edges:  # leaves its dependency's right side, enters its dependant's left side
        assert e["x1"] == nodes[e["from"]]["x"] + nodes[e["from"]]["w"] and e["x2"] == nodes[e["to"]]["x"]
        assert nodes[e["from"]]["x"] < nodes[e["to"]]["x"]
    # one row: the last layer (the report task) is the rightmost column; the box scrolls sideways to it
    assert nodes["report"]["x"] == max(n["x"] for n in nodes.values())
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    page.locator("[data-task-key='report']").scroll_into_view_if_needed()
    assert page.locator("[data-task-key='report']").is_visible()


def _waiting_run(gateway: ServeProcess, wid: str) -> str:
    """A run that stays live: its one task waits for an executor no worker offers (python)."""
    return start_run(gateway, apply(gateway, {"id": wid, "tasks": [{"key": "t0", "executor": "python"}]}))


def test_cancel_asks_first_in_place_and_without_the_script(
    gw: ServeProcess,
    open_ui: Callable[..., Any],
) -> None:
    run_id = _waiting_run(gw, "ui-layout-cancel")
    page = open_ui("operator")
    page.goto(f"/ui/runs/{run_id}")
    page.evaluate("window.__sameDocument = true")
    page.get_by_role("button", name="Cancel", exact=True).click()
    confirm = page.get_by_role("button", name="Yes, cancel the run")
    confirm.wait_for()
    assert page.evaluate("window.__sameDocument") is True  # shown in place
    assert page.get_by_role("button", name="Cancel", exact=True).count() == 0
    page.wait_for_timeout(1200)  # the live summary is redrawn meanwhile: the step stays open
    assert confirm.is_visible()
    assert get_run(gw, run_id)["status"] in ("pending", "running")
    page.locator("[data-cancel-back]").click()  # Back: nothing canceled
    assert page.get_by_role("button", name="Cancel", exact=True).is_visible()
    assert get_run(gw, run_id)["status"] in ("pending", "running")
    page.get_by_role("button", name="Cancel", exact=True).click()
    page.get_by_role("button", name="Yes, cancel the run").click()
    page.wait_for_url(gw.url(f"/ui/runs/{run_id}"))
    wait_until(lambda: get_run(gw, run_id)["status"] == "canceled", 10)
    page.locator("#run-status", has_text="canceled").wait_for()
    # without the script: the first post answers with the confirmation step, the second cancels
    other = _waiting_run(gw, "ui-layout-cancel-nojs")
    nojs = page.context.browser.new_context(java_script_enabled=False, base_url=gw.base_url)
    try:
        p = nojs.new_page()
        p.goto("/ui/")
        p.fill("input[name=token]", gw.tokens.operator)
        p.press("input[name=token]", "Enter")
        p.wait_for_load_state()
        p.goto(f"/ui/runs/{other}")
        p.get_by_role("button", name="Cancel", exact=True).click()
        p.wait_for_url(gw.url(f"/ui/runs/{other}?cancel=confirm"))
        assert get_run(gw, other)["status"] in ("pending", "running")
        p.get_by_role("button", name="Yes, cancel the run").click()
        p.wait_for_url(gw.url(f"/ui/runs/{other}"))
        assert get_run(gw, other)["status"] in ("canceled",) or get_run(gw, other)["cancel_requested_at"]
    finally:
        nojs.close()


def test_an_open_drawer_shows_its_error_column_and_leaves_cancel_clickable(
    gw: ServeProcess,
    open_ui: Callable[..., Any],
    workers: Workers,
) -> None:
    flaky = mock_task("flaky-with-a-long-name", max_attempts=2, sleep_ms=100, fail_attempts=1)
    hold = {"key": "hold", "executor": "python", "depends_on": ["flaky-with-a-long-name"]}
    run_id = start_run(gw, apply(gw, {"id": "ui-layout-drawer", "tasks": [flaky, hold]}))
    workers.start("ui-layout-worker-with-a-rather-long-display-name")
    page = open_ui("operator")
    page.goto(f"/ui/runs/{run_id}?task=flaky-with-a-long-name")

    # the retry has ended too: the run then stays as it is (hold waits for a python worker), no live redraw moves
    # what is measured below
    def failed_then_retried() -> bool:
        page.reload()
        return page.locator('#task-panel .attempts tbody.attempt[data-status="succeeded"]').count() == 1 and (
            page.locator("#task-panel .attempts tbody.attempt").count() == 2
        )

    wait_until(failed_then_retried, 20)
    assert page.locator("#task-panel").is_visible()
    fit = wait_until(lambda: page.evaluate(DRAWER_FIT), 5)
    box = fit["box"]
    assert len(fit["cells"]) == 2, fit
    for c in fit["cells"]:
        assert c["box_left"] <= c["left"] and c["right"] <= c["box_right"] + 0.5, (c, box)
    # no cell runs past the table's own box (it fits or scrolls in it), and the drawer does not scroll sideways
    assert not fit["sideways"], fit
    assert fit["wrap_right"] <= box["right"], fit
    assert "mock_flaky" in fit["text"]  # the Error column's code
    cancel = page.get_by_role("button", name="Cancel", exact=True)
    assert cancel.is_visible()
    cb = cancel.bounding_box()
    assert cb and cb["x"] + cb["width"] <= box["x"], (cb, box)  # beside the drawer, not under it
    assert wait_until(lambda: cancel.evaluate(ON_TOP), 5)
    cancel.click()
    # The confirmation is on top (the run's live redraw may replace it while this looks: it stays open) and has room:
    # its button is one line high, not squeezed into a narrow column beside the facts.
    # (One evaluation reads both: the element a locator found may be gone a moment later.)
    yes = page.get_by_role("button", name="Yes, cancel the run")
    seen = wait_until(lambda: (b := yes.evaluate(ON_TOP_AND_BOX))["on_top"] and b, 5)
    assert seen["height"] < 40 and seen["right"] <= box["x"], (seen, box)


def test_the_run_summary_fits_a_420_px_window(
    gw: ServeProcess,
    open_ui: Callable[..., Any],
) -> None:
    run_id = _waiting_run(gw, "ui-layout-narrow")
    page = open_ui("operator")
    page.set_viewport_size({"width": 420, "height": 800})
    page.goto(f"/ui/runs/{run_id}")
    summary = page.locator("#summary")
    assert summary.evaluate("s => s.scrollWidth <= s.clientWidth")
    assert page.evaluate("document.documentElement.scrollWidth") <= 420
    assert page.get_by_role("button", name="Cancel", exact=True).evaluate(ON_TOP)
    page.get_by_role("button", name="Cancel", exact=True).click()
    page.get_by_role("button", name="Yes, cancel the run").wait_for()
    assert page.evaluate("document.documentElement.scrollWidth") <= 420
