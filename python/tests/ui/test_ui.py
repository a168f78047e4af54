"""The web dashboard (``/ui/``) in a real headless Chromium against a real ``awp serve``, real workers and real runs.

Chromium is Debian's (``/usr/bin/chromium``, installed by ``make setup`` and ``.ci/run``), driven by Playwright
for Python with ``executable_path``: no browser is downloaded. Every page of every test is watched
(python/tests/ui/conftest.py, open_ui): a request to any other origin than the gateway's, a console error or an
uncaught exception fails the test.

``AWP_UI_SCREENSHOTS=docs pytest python/tests/ui/test_ui.py`` also writes the README's screenshots.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from ui_support import ui_post
from worker_support import Workers, all_items, api, apply, get_run, mock_task, start_run, wait_run

from awp.server.appstate import GatewayConfig
from awp.server.auth import Role
from awp.server.ui import dag
from awp.server.ui.session import SESSION_TTL_S, new_session, read_session, safe_next
from awp_testing.gateway import PROTOCOL, ServeProcess, wait_until

SCREENSHOTS = os.environ.get("AWP_UI_SCREENSHOTS")
ALL_SUCCEEDED = "[...document.querySelectorAll('#dag [data-task-key]')].every(n => n.dataset.status === 'succeeded')"
GATEWAY_SETTINGS = {"lease_duration_ms": 10000, "heartbeat_interval_ms": 1000}
DRAIN_WORKERS = False  # conftest.py, workers: killed at the end of a test, not drained
# Tests share one database: every live run is canceled after each (but ui-big's, kept for the module).
pytestmark = pytest.mark.usefixtures("no_live_runs")
KEEP_LIVE_WORKFLOWS = ("ui-big",)


def shot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / name))


def etl(wid: str, sleep: int = 700) -> dict[str, Any]:
    """A small ETL-shaped DAG (fan-out, fan-in, one flaky task)."""
    tasks = [mock_task("fetch-config", sleep_ms=sleep)]
    for i in range(1, 5):
        tasks.append(mock_task(f"extract-{i:02d}", ["fetch-config"], sleep_ms=sleep + 150 * i))
        flaky = {"fail_attempts": 1} if i == 3 else {}
        tasks.append(mock_task(f"transform-{i:02d}", [f"extract-{i:02d}"], max_attempts=2, sleep_ms=sleep, **flaky))
    tasks.append(mock_task("validate", [f"transform-{i:02d}" for i in range(1, 5)], sleep_ms=sleep // 2))
    tasks.append(mock_task("load", ["validate"], sleep_ms=sleep // 2, output={"rows": 1234}))
    tasks.append(mock_task("report", ["validate"], sleep_ms=sleep // 3))
    return {"id": wid, "concurrency": 6, "tasks": tasks}


def waiting_workflow(wid: str, n: int = 3) -> dict[str, Any]:
    """Tasks for an executor no worker offers: the run stays live, and costs nothing."""
    return {
        "id": wid,
        "tasks": [{"key": f"t{i}", "executor": "python", "depends_on": [f"t{i - 1}"] if i else []} for i in range(n)],
    }


# -- sign-in ---------------------------------------------------------------------------------------------


def test_a_wrong_token_or_a_worker_token_stays_on_the_form_and_the_right_one_signs_in(
    gw: ServeProcess, open_ui: Callable[..., Any]
) -> None:
    page = open_ui(None)
    page.goto("/ui/runs")  # signed out: sent to the form, which remembers where to go
    assert page.url.startswith(gw.url("/ui/?next="))
    session = httpx.post(
        gw.api("/workers/register"),
        json={"display_name": "ui-probe", "executor_kinds": ["mock"]},
        headers={**gw.auth("bootstrap"), **PROTOCOL},
    ).json()["session_token"]
    for token in ("wrong-" + gw.tokens.viewer, gw.tokens.bootstrap, session):
        page.fill("input[name=token]", token)
        page.click("button[type=submit]")
        assert page.locator("input[name=token]").is_visible()
        assert "Wrong token" in page.locator("[role=alert]").inner_text()
        assert page.context.cookies() == []
    page.fill("input[name=token]", gw.tokens.viewer)
    page.click("button[type=submit]")
    page.wait_for_url(gw.url("/ui/runs"))
    (cookie,) = page.context.cookies()
    assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"], cookie["secure"]) == (
        "awp_ui",
        True,
        "Strict",
        False,
    )
    assert "awp_ui" not in page.evaluate("document.cookie")
    assert page.locator(".role").text_content() == "viewer"
    page.click("text=Sign out")
    page.wait_for_url(gw.url("/ui/"))
    assert page.context.cookies() == []
    page.goto("/ui/workers")
    assert page.locator("input[name=token]").is_visible()


def test_the_session_cookie_is_secure_behind_tls_and_sign_out_needs_its_csrf_token(gw: ServeProcess) -> None:
    def client(cookie: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=gw.base_url, cookies={"awp_ui": cookie} if cookie else None)

    with client() as http:
        r = http.post("/ui/login", data={"token": gw.tokens.operator}, headers={"X-Forwarded-Proto": "https"})
        assert r.status_code == 303
        assert "; secure" in r.headers["set-cookie"].lower()
    with client() as http:
        r = http.post("/ui/login", data={"token": gw.tokens.operator}, headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        r = http.post("/ui/login", data={"token": gw.tokens.operator})
        cookie = r.cookies["awp_ui"]
    with client(cookie) as http:
        assert http.post("/ui/logout").status_code == 403  # no CSRF token
        r = http.get("/ui/runs")
        assert r.status_code == 200
        assert "default-src 'none'" in r.headers["Content-Security-Policy"]
    with client(cookie[:-2] + "xx") as http:  # a forged signature is no session
        r = http.get("/ui/runs")
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/?next=")


# -- the run page ----------------------------------------------------------------------------------------


def test_a_running_run_goes_live_to_succeeded_and_shows_attempts_and_events(
    gw: ServeProcess, workers: Workers, open_ui: Callable[..., Any]
) -> None:
    definition = etl("ui-etl")
    wf = apply(gw, definition)
    workers.start("ui-w1", concurrency=3)
    workers.start("ui-w2", concurrency=3)
    page = open_ui("operator")
    run_id = start_run(gw, wf)
    page.goto(f"/ui/runs/{run_id}")
    page.evaluate("window.__sameDocument = true")
    page.evaluate(
        """() => { window.__seen = new Set();
        new MutationObserver(ms => ms.forEach(m => window.__seen.add(m.target.dataset.status)))
          .observe(document.querySelector('#dag'),
                   {attributes: true, subtree: true, attributeFilter: ['data-status']}); }"""
    )
    nodes = page.locator("#dag [data-task-key]")
    assert nodes.count() == len(definition["tasks"])
    assert not page.evaluate(ALL_SUCCEEDED), "the run should still be running when the page opens"
    assert page.locator("#dag path.edge").count() == sum(len(t["depends_on"]) for t in definition["tasks"])
    assert page.locator(".legend li").count() == 9
    # layers: roots first (left), every edge goes to a later column
    x = {n.get_attribute("data-task-key"): float(n.locator("rect").get_attribute("x")) for n in nodes.all()}
    for t in definition["tasks"]:
        for d in t["depends_on"]:
            assert x[d] < x[t["key"]], (d, t["key"])
    assert x["fetch-config"] == min(x.values())
    page.wait_for_function("window.__seen.has('running')")
    if SCREENSHOTS:  # mid-run: a few tasks done, others running or waiting
        page.wait_for_function("document.querySelectorAll('#dag [data-status=succeeded]').length >= 5")
        shot(page, "ui-run.png")

    assert wait_run(gw, run_id)["status"] == "succeeded"
    finished = time.monotonic()
    page.wait_for_function(ALL_SUCCEEDED, timeout=5_000)
    lag = time.monotonic() - finished
    print(f"the page showed the run's end {lag:.2f}s after it ended")
    assert lag < 2.0, f"the page showed the end {lag:.2f}s after the run ended"
    assert page.evaluate("window.__sameDocument") is True  # no reload
    assert {"running", "succeeded"} <= set(page.evaluate("[...window.__seen]"))
    page.wait_for_function("document.querySelector('#run-status').textContent === 'succeeded'")
    assert '"rows": 1234' in page.locator("#summary").inner_text()  # the run's output (load has no dependant)
    assert page.locator("#summary button", has_text="Cancel").count() == 0
    # the event timeline: newest first, ends with the run's success
    first = page.locator("#events tr").first
    assert "succeeded" in first.inner_text() and "run" in first.inner_text()
    assert page.locator("#events tr").count() >= 20

    # the flaky task's attempts, opened with the keyboard
    page.focus("[data-task-key='transform-03']")
    page.keyboard.press("Enter")
    panel = page.locator("#task-panel")
    panel.locator(".attempt").nth(1).wait_for()
    assert page.evaluate("document.activeElement.id") == "task-h"
    first_attempt, second_attempt = panel.locator(".attempt").all()
    assert first_attempt.get_attribute("data-status") == "failed"
    assert "mock_flaky" in first_attempt.inner_text() and "attempt 1 fails" in first_attempt.inner_text()
    assert second_attempt.get_attribute("data-status") == "succeeded"
    assert re.search(r"ui-w[12]", second_attempt.inner_text())
    assert '"task": "transform-03"' in second_attempt.locator("pre").inner_text()  # output preview
    assert "?" in page.url and "task=transform-03" in page.url
    page.keyboard.press("Escape")
    assert panel.is_hidden()
    assert page.evaluate("document.activeElement.dataset.taskKey") == "transform-03"
    # a click opens another task; the server renders the same panel for a direct link
    page.click("[data-task-key='load']")
    panel.locator("h2", has_text="load").wait_for()
    page.reload()
    assert panel.is_visible() and "load" in panel.locator("h2").inner_text()


def test_a_run_waiting_for_an_executor_says_so_and_the_operator_cancels_it(
    gw: ServeProcess, open_ui: Callable[..., Any]
) -> None:
    run_id = start_run(gw, apply(gw, waiting_workflow("ui-gpu")))
    page = open_ui("operator")
    page.goto(f"/ui/runs/{run_id}")
    assert "Waiting for a worker with executor python" in " ".join(page.locator(".notice").inner_text().split())
    page.evaluate("window.__sameDocument = true")
    page.get_by_role("button", name="Cancel", exact=True).click()  # asks first (python/tests/ui/test_ui_layout.py)
    page.get_by_role("button", name="Yes, cancel the run").click()
    page.wait_for_url(gw.url(f"/ui/runs/{run_id}"))
    assert get_run(gw, run_id)["status"] == "canceled"
    assert page.locator("#run-status").inner_text() == "canceled"
    assert page.get_by_role("button", name="Cancel").count() == 0
    assert {n.get_attribute("data-status") for n in page.locator("#dag [data-task-key]").all()} == {"canceled"}


def test_the_run_pages_poll_answers_unchanged_from_the_revision_alone_and_the_change_after_one(
    gw: ServeProcess,
) -> None:
    run_id = start_run(gw, apply(gw, waiting_workflow("ui-poll")))
    with httpx.Client(base_url=gw.base_url, timeout=10) as http:
        cookie = http.post("/ui/login", data={"token": gw.tokens.viewer}).cookies["awp_ui"]
    with httpx.Client(base_url=gw.base_url, cookies={"awp_ui": cookie}, timeout=10) as http:

        def changes(revision: object, after: object = 0) -> httpx.Response:
            return http.get(f"/ui/runs/{run_id}/changes", params={"revision": str(revision), "after": str(after)})

        first = changes(0).json()
        assert not first.get("unchanged") and first["events"] and first["summary"]
        revision, after = first["revision"], first["after"]
        assert revision == get_run(gw, run_id)["revision"] and after == first["events"][-1]["sequence"]
        # At the current revision: that alone (read by awp.run_revision, not awp.get_run's counts of every task)
        assert changes(revision, after).json() == {"revision": revision, "status": first["status"], "unchanged": True}
        api(gw, "POST", f"/runs/{run_id}/cancel", {})
        changed = changes(revision, after).json()
        assert not changed.get("unchanged") and changed["revision"] > revision and changed["status"] == "canceled"
        assert {e["to_status"] for e in changed["events"]} >= {"canceled"}
        assert all(e["sequence"] > after for e in changed["events"])
        assert changes(changed["revision"], changed["after"]).json()["unchanged"] is True
        missing = http.get("/ui/runs/run_nope/changes", params={"revision": "1", "after": "0"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_a_viewer_sees_no_cancel_button_and_its_post_is_refused(gw: ServeProcess, open_ui: Callable[..., Any]) -> None:
    run_id = start_run(gw, apply(gw, waiting_workflow("ui-gpu-viewer")))
    viewer = open_ui("viewer")
    viewer.goto(f"/ui/runs/{run_id}")
    assert viewer.get_by_role("button", name="Cancel").count() == 0
    csrf = viewer.locator("input[name=csrf_token]").first.get_attribute("value")
    r = ui_post(viewer, f"/ui/runs/{run_id}/cancel", {"csrf_token": csrf})
    assert r.status == 403 and "only the operator" in r.text()
    operator = open_ui("operator")
    operator.goto(f"/ui/runs/{run_id}")
    assert operator.get_by_role("button", name="Cancel").is_visible()
    assert ui_post(operator, f"/ui/runs/{run_id}/cancel", {}).status == 403  # no CSRF token
    assert ui_post(operator, f"/ui/runs/{run_id}/cancel", {"csrf_token": csrf}).status == 403  # the viewer's
    token = operator.locator("input[name=csrf_token]").first.get_attribute("value")
    forged = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
    assert ui_post(operator, f"/ui/runs/{run_id}/cancel", {"csrf_token": token}, forged).status == 403
    assert get_run(gw, run_id)["status"] in ("pending", "running")
    api(gw, "POST", f"/runs/{run_id}/cancel", {})


# -- the runs and workers pages --------------------------------------------------------------------------


def test_runs_are_listed_newest_first_paged_filtered_and_live(gw: ServeProcess, open_ui: Callable[..., Any]) -> None:
    wf = apply(gw, waiting_workflow("ui-list", 1))
    mine = [start_run(gw, wf) for _ in range(27)]
    api(gw, "POST", f"/runs/{mine[0]}/cancel", {})
    page = open_ui("viewer")
    rows = page.locator("table.runs tbody tr[data-run-id]")
    assert rows.count() == 25
    newest_first = [r["run_id"] for r in api(gw, "GET", "/runs?limit=25")["items"]]
    assert [r.get_attribute("data-run-id") for r in rows.all()] == newest_first
    row = page.locator(f"tr[data-run-id='{mine[-1]}']")
    assert page.locator(f'a[href="/ui/runs/{mine[-1]}"]').count() == 1
    text = row.inner_text()
    assert "ui-list" in text and "v1" in text and "pending" in text and "0/1" in text
    page.click("text=Older »")
    assert mine[0] in [r.get_attribute("data-run-id") for r in rows.all()]
    # filters
    page.goto("/ui/runs")
    page.select_option("#f-status", "canceled")
    page.select_option("#f-workflow", "ui-list")
    page.click("text=Filter")
    assert [r.get_attribute("data-run-id") for r in rows.all()] == [mine[0]]
    page.goto("/ui/runs?workflow=ui-list")
    # live: a new run appears, a cancel shows, without a reload
    page.evaluate("window.__sameDocument = true")
    fresh = start_run(gw, wf)
    page.locator(f"tr[data-run-id='{fresh}']").wait_for(timeout=5_000)
    assert rows.first.get_attribute("data-run-id") == fresh
    api(gw, "POST", f"/runs/{fresh}/cancel", {})
    page.wait_for_selector(f"tr[data-run-id='{fresh}'][data-status=canceled]", timeout=5_000)
    assert page.evaluate("window.__sameDocument") is True
    page.click(f'a[href="/ui/runs/{fresh}"]')
    page.wait_for_url(gw.url(f"/ui/runs/{fresh}"))
    for run_id in mine:
        api(gw, "POST", f"/runs/{run_id}/cancel", {})


def test_the_runs_page_shows_failed_and_running_runs_with_their_progress(
    gw: ServeProcess, workers: Workers, open_ui: Callable[..., Any]
) -> None:
    """A mixed list (also the README's screenshot): succeeded, failed, canceled and running runs."""
    workers.start("ui-shot", concurrency=4)
    page = open_ui("viewer")
    report = apply(gw, {"id": "ui-report", "tasks": [mock_task("a", sleep_ms=50), mock_task("b", ["a"])]})
    failing = apply(gw, {"id": "ui-nightly", "tasks": [mock_task("a"), mock_task("b", ["a"], fail="permanent")]})
    done = [start_run(gw, report), start_run(gw, failing)]
    stuck = start_run(gw, apply(gw, waiting_workflow("ui-gpu-batch")))
    api(gw, "POST", f"/runs/{stuck}/cancel", {})
    done += [start_run(gw, report)]
    assert [wait_run(gw, run_id)["status"] for run_id in done] == ["succeeded", "failed", "succeeded"]
    long = start_run(gw, apply(gw, etl("ui-etl", sleep=2000)))
    wait_until(lambda: get_run(gw, long)["task_counts"].get("succeeded"), 15, 0.1, "a first task done")
    page.goto("/ui/runs")
    page.locator(f"tr[data-run-id='{long}'][data-status=running]").wait_for()
    failed = page.locator(f"tr[data-run-id='{done[1]}']")
    assert failed.get_attribute("data-status") == "failed"
    assert "1 failed" in failed.inner_text() and "2/2" in failed.inner_text()
    assert page.locator(f"tr[data-run-id='{stuck}'][data-status=canceled]").count() == 1
    shot(page, "ui-runs.png")
    api(gw, "POST", f"/runs/{long}/cancel", {})


def test_the_workers_page_marks_each_worker_and_follows_a_drain(
    gw: ServeProcess, workers: Workers, open_ui: Callable[..., Any]
) -> None:
    busy = workers.start("ui-busy", executors="mock,python", concurrency=2, shutdown_timeout=20)
    wait_until(lambda: _worker(gw, "ui-busy"), 10, 0.05, "ui-busy registered")
    run_id = start_run(gw, apply(gw, {"id": "ui-slow", "tasks": [mock_task("slow", sleep_ms=30_000)]}))
    wait_until(lambda: get_run(gw, run_id)["task_counts"].get("running"), 10, 0.05, "the slow task to run")
    spare = workers.start("ui-spare", concurrency=3)
    workers.start("ui-idle", concurrency=3)
    ids = {
        name: wait_until(functools.partial(_worker, gw, name), 10, 0.05, name)["worker_id"]
        for name in ("ui-busy", "ui-spare", "ui-idle")
    }
    page = open_ui("viewer")
    page.goto("/ui/workers")
    page.evaluate("window.__sameDocument = true")
    rows = {name: page.locator(f"tr[data-worker-id='{worker_id}']") for name, worker_id in ids.items()}
    for name, row in rows.items():
        assert row.count() == 1
        text = row.inner_text()
        assert name in text and "active" in text and " ago" in text, text
    assert "mock" in rows["ui-busy"].inner_text() and "python" in rows["ui-busy"].inner_text()
    assert "1 / 2" in rows["ui-busy"].inner_text() and "0 / 3" in rows["ui-idle"].inner_text()
    busy.signal(signal.SIGTERM)  # drains: finishes its task first, then stops
    spare.signal(signal.SIGTERM)  # nothing to finish: stops at once
    page.wait_for_selector(f"tr[data-worker-id='{ids['ui-busy']}'][data-status=draining]", timeout=5_000)
    page.wait_for_selector(f"tr[data-worker-id='{ids['ui-spare']}'][data-status=stopped]", timeout=5_000)
    assert "takes no new work" in rows["ui-busy"].inner_text()
    shot(page, "ui-workers.png")
    api(gw, "POST", f"/runs/{run_id}/cancel", {})  # revokes the lease: the draining worker can stop
    page.wait_for_selector(f"tr[data-worker-id='{ids['ui-busy']}'][data-status=stopped]", timeout=10_000)
    assert "gone" in (rows["ui-busy"].get_attribute("class") or "")
    assert page.evaluate("window.__sameDocument") is True


def _worker(gw: ServeProcess, name: str) -> dict[str, Any] | None:
    found = [w for w in all_items(gw, "/workers") if w["display_name"] == name and w["status"] == "active"]
    return found[-1] if found else None


# -- a large run -----------------------------------------------------------------------------------------


def test_a_10000_task_run_page_loads_in_bounded_time_and_draws_a_bounded_page(
    gw: ServeProcess, open_ui: Callable[..., Any]
) -> None:
    n = 10_000
    t0 = time.monotonic()
    wf = _big_workflow(gw, "ui-big", n)
    run_id = _start(gw, wf)
    print(f"10,000 tasks: workflow and run created in {time.monotonic() - t0:.1f}s")
    page = open_ui("viewer")
    started = time.monotonic()
    page.goto(f"/ui/runs/{run_id}")
    loaded = time.monotonic() - started
    assert loaded < 15, f"the 10,000-task page took {loaded:.1f}s"
    drawn = page.locator("#dag [data-task-key]")
    assert 0 < drawn.count() <= dag.PAGE_SIZE
    assert page.locator("#dag path.edge").count() < 2 * dag.PAGE_SIZE
    assert page.locator("#overview [data-band]").count() == 3  # root, the 9,998 parts, merge
    assert f"of {n}" in page.locator(".pager").inner_text()
    t0 = time.monotonic()
    assert page.evaluate("1 + 1") == 2
    answered = time.monotonic() - t0
    longest = page.evaluate("window.__longest")
    print(f"10,000 tasks: page loaded in {loaded:.2f}s, longest main-thread task {longest:.0f} ms")
    assert answered < 1.0, "the tab does not answer"
    assert longest < 3000, f"the main thread was busy for {longest:.0f} ms at once"
    first_page = {k.get_attribute("data-task-key") for k in drawn.all()}
    # Page 2 costs the server what page 1 did (bounded above); a busy machine may take longer than the
    # default 15 s to serve it, and this step checks what it shows, not its time.
    with page.expect_navigation(url=re.compile(r"page=2"), timeout=60_000):
        page.click("a[rel=next]")
    assert first_page.isdisjoint({k.get_attribute("data-task-key") for k in drawn.all()})
    page.goto(f"/ui/runs/{run_id}?status=waiting_dependencies")
    assert {k.get_attribute("data-status") for k in drawn.all()} == {"waiting_dependencies"}
    # The run stays live (no worker offers its executor): cancelling 10,000 tasks costs seconds, and the
    # module's database is dropped next, so the teardown leaves it (see no_live_runs).


def test_a_paged_run_follows_a_mass_change_live(gw: ServeProcess, open_ui: Callable[..., Any]) -> None:
    n = 1_000
    run_id = _start(gw, _big_workflow(gw, "ui-paged", n))
    page = open_ui("viewer")
    page.goto(f"/ui/runs/{run_id}?page=2")
    assert page.locator("#dag [data-task-key]").count() == dag.PAGE_SIZE
    page.evaluate("window.__sameDocument = true")
    api(gw, "POST", f"/runs/{run_id}/cancel", {})  # every task changes at once: events come in batches
    page.wait_for_function(
        "[...document.querySelectorAll('#dag [data-task-key]')].every(n => n.dataset.status === 'canceled')",
        timeout=10_000,
    )
    page.wait_for_function(
        f"document.querySelector('#overview [data-band=\"1\"] .band-count').textContent === '{n - 2}/{n - 2} done'",
        timeout=10_000,
    )
    assert page.locator("#run-status").inner_text() == "canceled"
    assert page.evaluate("window.__sameDocument") is True
    assert page.evaluate("window.__longest") < 3000


def _big_workflow(gw: ServeProcess, wid: str, n: int) -> tuple[str, int]:
    """root -> n-2 parts -> merge, for the python executor (no worker of these tests offers it then)."""
    tasks: list[dict[str, Any]] = [{"key": "root", "executor": "python", "action": "nothing"}]
    parts = [f"part-{i:05d}" for i in range(n - 2)]
    tasks += [{"key": k, "executor": "python", "action": "nothing", "depends_on": ["root"]} for k in parts]
    tasks.append({"key": "merge", "executor": "python", "action": "nothing", "depends_on": parts})
    headers = {**gw.auth("operator"), "Idempotency-Key": wid}
    r = httpx.post(gw.api("/workflows"), json={"id": wid, "tasks": tasks}, headers=headers, timeout=180)
    assert r.status_code == 201, r.text
    return wid, r.json()["version"]


def _start(gw: ServeProcess, wf: tuple[str, int]) -> str:
    headers = {**gw.auth("operator"), "Idempotency-Key": f"run-{wf[0]}"}
    r = httpx.post(gw.api(f"/workflows/{wf[0]}/versions/{wf[1]}/runs"), headers=headers, timeout=180)
    assert r.status_code == 202, r.text
    return r.json()["run_id"]


# -- pure layout -----------------------------------------------------------------------------------------


def test_the_layout_puts_roots_first_never_overlaps_and_pages_large_graphs() -> None:
    T = dag.Task
    tasks = [
        T("a", "ready"),
        T("b", "ready", ("a",)),
        T("c", "ready", ("a",)),
        T("d", "ready", ("b", "c")),
        T("e", "ready", ("a", "d")),
    ]
    layered = dag.layer(tasks)
    assert layered.layers == [["a"], ["b", "c"], ["d"], ["e"]]
    drawing = dag.draw(layered)
    at = {n.key: n for n in drawing.nodes}
    assert all(at[e.source].x < at[e.target].x for e in drawing.edges)
    assert len(drawing.edges) == 6
    boxes = {(n.x, n.y) for n in drawing.nodes}
    assert len(boxes) == len(tasks)
    fan = [T("r", "ready")] + [T(f"m{i}", "ready", ("r",)) for i in range(1000)]
    big = dag.layer(fan)
    pages = dag.pages(big, 300)
    assert [len(p) for p in pages] == [300, 300, 300, 101]
    d = dag.draw(big, pages[0])
    assert len(d.nodes) == 300 and d.width <= 1300
    assert len({(n.x, n.y) for n in d.nodes}) == 300
    over = dag.overview(big, 300)
    assert [b.size for b in over.bands] == [1, 1000] and [b.first_page for b in over.bands] == [0, 0]
    chain = dag.layer([T(f"c{i}", "ready", (f"c{i - 1}",) if i else ()) for i in range(500)])
    assert len(dag.overview(chain).bands) <= 24
    assert dag.draw(chain, dag.pages(chain)[0]).width <= 1300


def test_a_session_is_signed_per_role_and_expires() -> None:
    config = GatewayConfig("postgresql:///unused", "view-secret", "op-secret", "boot-secret")
    now = time.time()
    viewer = new_session(config, Role.VIEWER, now)
    session = read_session(config, viewer, now)
    assert session is not None and session.role is Role.VIEWER and not session.operator
    assert read_session(config, viewer, now + SESSION_TTL_S + 1) is None  # expired
    assert read_session(config, "operator" + viewer.removeprefix("viewer"), now) is None  # role swapped
    assert read_session(config, "bootstrap" + viewer.removeprefix("viewer"), now) is None
    rotated = GatewayConfig("postgresql:///unused", "view-secret-2", "op-secret", "boot-secret")
    assert read_session(rotated, viewer, now) is None  # a new viewer token signs its sessions out
    operator = read_session(config, new_session(config, Role.OPERATOR, now), now)
    assert operator is not None and operator.operator and operator.csrf != session.csrf
    assert safe_next("//evil.example/x") == "/ui/runs" and safe_next("https://evil.example") == "/ui/runs"
    assert safe_next("/ui/workers") == "/ui/workers"
