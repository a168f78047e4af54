"""The dashboard's pages and the parts their script fetches: runs, a run (its DAG, events, task panel, log tail,
live changes), workers, and the static files.

Live updates: the run page polls ``/ui/runs/{id}/changes?revision=R&after=S`` about twice a second; the answer
is tiny while the run's ``revision`` is unchanged (read by ``awp.run_revision``, one row: ``awp.get_run`` counts
every task, 125-150 ms at 10,000 tasks on a slow phase of this project's machine) and otherwise carries the new
events (sequence > S, from ``awp.run_events``), which the page applies to the DAG in place, and the re-rendered
summary (a big live run's read shared by every tab for a moment: python/awp/server/ui/recent.py). The runs and workers
pages re-fetch their table (``?fragment=1``, with an ETag) every two seconds.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from aiohttp import web

from awp.protocol.statuses import LIVE_RUN, RUN_STATUSES, TASK_STATUSES, WAITING_TASK
from awp.server.appstate import DB
from awp.server.errors import ApiError
from awp.server.ui.render import GLYPH, INSTANCES_PAGE, RECENT, STATIC, as_utc, off_loop, render, render_html, utc_now
from awp.server.ui.routing import Route, fragment_response, json_answer, page_number, query_param, ui_route
from awp.server.ui.runview import cancel_view, rerun_view, run_view, task_context
from awp.server.ui.session import Session

RUNS_PAGE = 25
TIMELINE = 100  # events shown on the run page
CHANGES_LIMIT = 1000  # events per /changes answer
WAITS_LIMIT = 500  # /changes carries each waiting task's reason while at most this many wait
WORKER_ORDER = {"active": 0, "draining": 1, "offline": 2, "stopped": 3}
LOG_TAIL_PAGE = 500  # entries the task panel's log tail asks for at once

ROUTES: list[Route] = []  # added to the application by awp.server.ui.setup_ui


# -- static files --------------------------------------------------------------------------------------


@ui_route(ROUTES, "GET", "/ui/static/{name}", kind="open")
async def static_file(request: web.Request, session: Session | None) -> web.StreamResponse:
    entry = request.app[STATIC].get(request.match_info["name"])
    if entry is None:
        raise ApiError.of(404, "no such file")
    body, ctype, etag = entry
    headers = {"ETag": f'"{etag}"', "Cache-Control": "public, max-age=31536000, immutable"}
    if "v" not in request.query:
        headers["Cache-Control"] = "no-cache"
    if request.headers.get("If-None-Match") == f'"{etag}"':
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, content_type=ctype, headers=headers)


# -- runs ----------------------------------------------------------------------------------------------


@ui_route(ROUTES, "GET", "/ui/runs")
async def runs_page(request: web.Request, session: Session | None) -> web.StreamResponse:
    status = query_param(request, "status")
    if status is not None and status not in RUN_STATUSES:
        raise ApiError.of(400, f"unknown run status {status!r}")
    workflow = query_param(request, "workflow")
    after = query_param(request, "after")
    db = request.app[DB]
    rows = await db.list_runs(workflow, status, after, RUNS_PAGE + 1)
    more = len(rows) > RUNS_PAGE
    rows = rows[:RUNS_PAGE]
    filters = {k: v for k, v in (("status", status), ("workflow", workflow)) if v}
    older = "/ui/runs?" + urlencode({**filters, "after": rows[-1]["run_id"]}) if more else None
    newest = "/ui/runs?" + urlencode(filters) if after else None
    context: dict[str, Any] = {
        "session": session,
        "runs": rows,
        "older": older,
        "newest": newest,
        "now": utc_now(),
        "nav": "runs",
    }
    if request.query.get("fragment"):
        return fragment_response(request, render(request, "_runs_table.html", **context))
    workflows = [w["workflow_id"] for w in await db.list_workflows()]
    return render(request, "runs.html", status_filter=status, workflow_filter=workflow, workflows=workflows, **context)


async def latest_events(db: Any, run_id: str, n: int) -> tuple[list[dict[str, Any]], int]:
    """The last ``n`` events of a run (oldest first) and the last sequence, through ``awp.run_events`` only.

    Sequences are contiguous from 1, so the last one is found with a galloping then binary search on
    "is there an event after k" (one indexed row each): about 2·log2(events) tiny queries."""

    async def after(k: int) -> bool:  # is the last sequence > k?
        return bool(await db.run_events(run_id, k, 1))

    if not await after(0):
        return [], 0
    hi = 1
    while await after(hi):
        hi *= 2
    lo = hi // 2  # the last sequence is in (lo, hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await after(mid):
            lo = mid
        else:
            hi = mid
    last = hi
    rows = await db.run_events(run_id, max(0, last - n), n)
    return rows, (rows[-1]["sequence"] if rows else last)


@ui_route(ROUTES, "GET", "/ui/runs/{run_id}")
async def run_page(request: web.Request, session: Session | None) -> web.StreamResponse:
    run_id = request.match_info["run_id"]
    db = request.app[DB]
    status = query_param(request, "status")
    if status is not None and status not in TASK_STATUSES:
        raise ApiError.of(400, f"unknown task status {status!r}")
    page = page_number(request.query.get("page"))
    # Events first, tasks second: the tasks then include every change up to the last event shown, and the page
    # replays the changes after it (replaying one already included is harmless: statuses are set, not shifted).
    run = await db.get_run(run_id)
    events, last_sequence = await latest_events(db, run_id, TIMELINE)
    rows = await db.run_tasks(run_id)
    view = await off_loop(request, run_view, rows, page, status)  # the layout: up to 10,000 tasks
    selected = query_param(request, "task", 1024)
    ipage = page_number(request.query.get("ipage"))
    panel = await task_context(db, run_id, selected, ipage, request.query) if selected else None
    base = {k: v for k, v in (("status", status),) if v}

    def page_url(p: int) -> str:
        return f"/ui/runs/{quote(run_id, safe='')}?" + urlencode({**base, "page": p + 1})

    state = {
        "run_id": run_id,
        "revision": run["revision"],
        "status": run["status"],
        "after": last_sequence,
        "timeline": TIMELINE,
        "glyph": GLYPH,
        "statuses": TASK_STATUSES,
        "bands": view.overview.members if view.overview else None,
        # per band, one character per task: its status, as an index into "statuses"
        "band_status": view.overview.status_codes(TASK_STATUSES) if view.overview else None,
        # per mapped task, its instances' statuses (same characters): the script keeps each node's count live
        "mapped": view.instances,
        "instances_page": INSTANCES_PAGE,
    }
    html = await off_loop(
        request,
        render_html,
        request.app,
        "run.html",
        session=session,
        run=run,
        view=view,
        events=list(reversed(events)),
        page_url=page_url,
        task_status=status,
        state=state,
        task_ctx=panel,
        rerun=rerun_view(run, request.query),
        cancel_step=cancel_view(run, request.query),
        now=utc_now(),
        nav="runs",
    )
    return web.Response(body=html, content_type="text/html", charset="utf-8")


def _event(e: dict[str, Any]) -> dict[str, Any]:
    return {
        "sequence": e["sequence"],
        "entity_type": e["entity_type"],
        "entity_key": e["entity_key"],
        "from_status": e["from_status"],
        "to_status": e["to_status"],
        "reason": e["reason"],
        "time": as_utc(e["occurred_at"]).strftime("%H:%M:%S.%f")[:-3],
        "at": as_utc(e["occurred_at"]).isoformat(timespec="milliseconds"),
    }


@ui_route(ROUTES, "GET", "/ui/runs/{run_id}/changes", kind="part")
async def run_changes(request: web.Request, session: Session | None) -> web.StreamResponse:
    run_id = request.match_info["run_id"]
    revision = request.query.get("revision", "")
    after_arg = request.query.get("after", "0")
    if not after_arg.isdigit() or len(after_arg) > 18:
        raise ApiError.of(400, "after must be an event sequence number")
    db = request.app[DB]
    head = await db.run_revision(run_id)  # every tab polls twice a second: get_run's task counts only on a change
    if revision == str(head["revision"]):
        return json_answer({"revision": head["revision"], "status": head["status"], "unchanged": True})

    async def read() -> tuple[dict[str, Any], dict[str, str] | None]:
        run = await db.get_run(run_id)
        # What holds each waiting task, for the graph's node titles ("reason: detail"; docs/limits.md): only while
        # few tasks wait, so a big run's answers stay small (its nodes then show their status alone).
        counts = run.get("task_counts") or {}
        if run["status"] in LIVE_RUN and sum(int(counts.get(s, 0)) for s in WAITING_TASK) <= WAITS_LIMIT:
            return run, {w["task_key"]: f"{w['reason']}: {w['detail']}" for w in await db.run_waits(run_id)}
        return run, None

    run, waits = await request.app[RECENT].read(run_id, head["status"], read)  # a big run's: shared a moment
    answer: dict[str, Any] = {"revision": run["revision"], "status": run["status"]}
    rows = await db.run_events(run_id, int(after_arg), CHANGES_LIMIT + 1)
    answer["more"] = len(rows) > CHANGES_LIMIT
    rows = rows[:CHANGES_LIMIT]
    answer["events"] = [_event(e) for e in rows]
    answer["after"] = rows[-1]["sequence"] if rows else int(after_arg)
    answer["summary"] = render_html(
        request.app,
        "_run_summary.html",
        session=session,
        run=run,
        rerun=rerun_view(run, {}),
        cancel_step=cancel_view(run, {}),
        now=utc_now(),
    ).decode()
    if waits is not None:
        answer["waits"] = waits
    return json_answer(answer)


@ui_route(ROUTES, "GET", "/ui/runs/{run_id}/tasks/{task_key}", kind="part")
async def task_part(request: web.Request, session: Session | None) -> web.StreamResponse:
    run_id, task_key = request.match_info["run_id"], request.match_info["task_key"]
    ipage = page_number(request.query.get("ipage"))
    context = await task_context(request.app[DB], run_id, task_key, ipage, request.query)
    return render(request, "_task.html", session=session, **context)


@ui_route(ROUTES, "GET", "/ui/runs/{run_id}/tasks/{task_key}/logs", kind="part")
async def task_logs_part(request: web.Request, session: Session | None) -> web.StreamResponse:
    """The task panel's live log tail (docs/progress.md): ``awp.task_logs`` after ``after``, as JSON."""
    run_id, task_key = request.match_info["run_id"], request.match_info["task_key"]
    after = request.query.get("after", "0")
    if not after.isascii() or not after.isdigit() or len(after) > 18:
        raise ApiError.of(400, "after must be a sequence number")
    return json_answer(await request.app[DB].task_logs(run_id, task_key, None, int(after), LOG_TAIL_PAGE))


# -- workers -------------------------------------------------------------------------------------------


@ui_route(ROUTES, "GET", "/ui/workers")
async def workers_page(request: web.Request, session: Session | None) -> web.StreamResponse:
    rows = await request.app[DB].list_workers()
    rows.sort(key=lambda w: (WORKER_ORDER.get(w["status"], 9), -w["registered_at"].timestamp(), w["worker_id"]))
    counts = {s: sum(1 for w in rows if w["status"] == s) for s in WORKER_ORDER}
    context: dict[str, Any] = {
        "session": session,
        "workers": rows,
        "counts": counts,
        "now": utc_now(),
        "nav": "workers",
    }
    if request.query.get("fragment"):
        return fragment_response(request, render(request, "_workers_table.html", **context))
    return render(request, "workers.html", **context)
