"""What the run page draws and its task panel shows: the DAG (all of it, or a page and an overview), a mapped
task's instances, the state of the panel's signal buttons and of the summary's Re-run and Cancel steps.

Dynamic workflows (docs/dynamic.md): the instances of a mapped (``for_each``) task are not nodes of the graph (up
to 10,000 of them: python/awp/server/ui/dag.py); its node shows "succeeded/instances", and its task panel lists them
:data:`INSTANCES_PAGE` at a time (``?task=each&ipage=N``: one ``awp.run_tasks`` page after the instance before the
first shown, as instances are contiguous in definition order). The page's state carries each mapped task's instance
statuses (one character each), so the count follows the events live without asking the database again. A task that
started a child run links to it from its panel (graph nodes are links already, and a link cannot hold another); a
child run's page names its parent run and task.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from typing import Any

from awp.protocol.statuses import LIVE_RUN, TASK_STATUSES
from awp.server.ui import dag
from awp.server.ui.render import INSTANCES_PAGE, RERUN_STATUSES, SIGNALS, status_text, utc_now

# The words of the task panel's notice after a signal (render.SIGNALS) was sent, or refused.
SIGNAL_DONE = {"approve": "Approved", "reject": "Rejected"}
SIGNAL_NOT_DONE = {"approve": "Not approved", "reject": "Not rejected"}


@dataclass
class RunView:
    """What the run page draws: the DAG (all of it, or one page of it plus an overview)."""

    drawing: dag.Drawing
    overview: dag.Overview | None
    page: int
    pages: int
    shown_from: int
    shown_to: int
    matching: int
    total: int
    # per mapped task, its instances' statuses in index order, one character each (dag.status_digits)
    instances: dict[str, str] = field(default_factory=dict)


def instance_statuses(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Per mapped task of ``rows`` (``awp.run_tasks``), its instances' statuses in index order as one character each
    (the index in TASK_STATUSES, base 36): what the page's script counts the succeeded ones from."""
    digit = dag.status_digits(TASK_STATUSES)
    codes: dict[str, list[str]] = {}
    for r in rows:
        mapped = r.get("mapped_task")
        if mapped is not None:
            codes.setdefault(mapped, []).append(digit.get(r["status"], "z"))  # rows are in index order
    return {k: "".join(v) for k, v in codes.items()}


def run_view(rows: list[dict[str, Any]], page: int, status: str | None, page_size: int = dag.PAGE_SIZE) -> RunView:
    """The graph of ``rows`` (``awp.run_tasks``): the instances of mapped tasks are not drawn (dag.tasks_from_rows),
    their statuses are counted instead (:func:`instance_statuses`)."""
    layered = dag.layer(dag.tasks_from_rows(rows))
    instances = instance_statuses(rows)
    total = len(layered.tasks)
    if total <= page_size and status is None:
        return RunView(dag.draw(layered), None, 0, 1, 1 if total else 0, total, total, total, instances)
    keys = layered.order if status is None else [k for k in layered.order if layered.tasks[k].status == status]
    cut = dag.pages(layered, page_size, keys)
    page = min(max(page, 0), len(cut) - 1)
    shown = cut[page]
    start = page * page_size
    over = dag.overview(layered, page_size) if total > page_size else None
    return RunView(
        dag.draw(layered, shown),
        over,
        page,
        len(cut),
        start + 1 if shown else 0,
        start + len(shown),
        len(keys),
        total,
        instances,
    )


@dataclass
class Instances:
    """One page of a mapped task's instances, for its task panel."""

    rows: list[dict[str, Any]]  # awp.run_tasks rows (the first one may be awp.get_task's), in index order
    page: int  # 0-based
    pages: int
    count: int  # every instance of the task
    succeeded: int

    @property
    def first(self) -> int:
        """The index of the page's first instance."""
        return self.page * INSTANCES_PAGE


async def read_instances(db: Any, run_id: str, task: dict[str, Any], page: int) -> Instances | None:
    """Page ``page`` (0-based, clamped) of a mapped task's instances, or None for a task that has none (not mapped,
    or not yet expanded). Instances ``<key>[0..n-1]`` are created together, after every other task of the run and
    in index order (db/functions/_dynamic.sql, awp._expand_for_each), so page p is the ``awp.run_tasks`` page after
    ``<key>[p*50-1]``; the first page starts with ``<key>[0]`` itself (``awp.get_task``). Two reads of at most 50
    rows, whatever the number of instances (on a live run each also ranks what holds its waiting tasks, as every
    ``awp.run_tasks`` call does: 45 ms for a page of a run with 10,000 waiting instances, 40 ms for the last page of
    a run with 3,000 through the gateway, on this project's machine)."""
    count = task.get("item_count")
    if count is None:
        return None
    key = task["task_key"]
    pages = max(1, math.ceil(count / INSTANCES_PAGE))
    page = min(max(page, 0), pages - 1)
    start = page * INSTANCES_PAGE
    limit = min(INSTANCES_PAGE, count - start)
    rows: list[dict[str, Any]] = []
    if limit > 0 and start == 0:
        rows = [await db.get_task(run_id, f"{key}[0]")]
        if limit > 1:
            rows += await db.run_tasks(run_id, f"{key}[0]", limit - 1)
    elif limit > 0:
        rows = await db.run_tasks(run_id, f"{key}[{start - 1}]", limit)
    rows = [r for r in rows if r.get("mapped_task") == key]
    return Instances(rows, page, pages, count, int(task.get("instances_succeeded") or 0))


async def _workers_by_id(db: Any) -> dict[str, dict[str, Any]]:
    return {w["worker_id"]: w for w in await db.list_workers()}


def signal_name(value: Any) -> str | None:
    """``approve`` or ``reject`` (a key of :data:`SIGNALS`), else None."""
    return value if isinstance(value, str) and value in SIGNALS else None


def signal_view(task: dict[str, Any], query: Any) -> dict[str, Any]:
    """What the task panel's signal part shows, from the query of the page (or of the script's request):
    ``confirm=approve|reject`` opens the confirmation step (python/awp/server/ui/templates/_task.html), ``sent=…`` and
    ``refused=…`` (where ``actions.signal_task`` redirects) a notice of the outcome. A notice is shown only when the
    task bears it out (a ``sent`` task's output is that payload, a ``refused`` task does not wait for a signal), so a
    link with such a query cannot make the panel claim what did not happen."""
    confirm = signal_name(query.get("confirm"))
    notice: dict[str, str] | None = None
    sent, refused = signal_name(query.get("sent")), signal_name(query.get("refused"))
    if sent is not None and task.get("output") == SIGNALS[sent]:
        notice = {
            "outcome": "sent",
            "signal": sent,
            "text": f"{SIGNAL_DONE[sent]}: the task received {json.dumps(SIGNALS[sent])} and succeeded with it as "
            "its output.",
        }
    elif refused is not None and task.get("wait_reason") != "waiting_signal":
        if task["executor"] != "signal":
            why = f"its executor is {task['executor']}"
        elif task["status"] != "running":
            why = f"its status is {status_text(task['status'], task.get('skip_reason'))}"
        else:
            why = "its run is being canceled or has ended"
        notice = {
            "outcome": "refused",
            "signal": refused,
            "text": f"{SIGNAL_NOT_DONE[refused]}: the task is not waiting for a signal ({why}), so nothing was "
            "sent. Someone may have signalled it first, or its wait timed out or its run was canceled.",
        }
    return {"confirm": confirm, "notice": notice}


def rerun_view(run: dict[str, Any], query: Any) -> dict[str, Any]:
    """What the run summary's Re-run part shows, from the query of the page: ``rerun=confirm`` opens the
    confirmation step (python/awp/server/ui/templates/_run_summary.html) while the run can be re-run, ``rerun=refused``
    (where ``actions.retry_run`` redirects after AWREQ) a notice, only while the run bears it out (it is not failed or
    canceled), so a link with such a query cannot make the page claim what did not happen."""
    step = query.get("rerun")
    notice = None
    if step == "refused" and run["status"] not in RERUN_STATUSES:
        notice = (
            f"Not re-run: the run is {run['status']}, not failed or canceled, so nothing was changed. Someone may "
            "have re-run it first."
        )
    return {"confirm": step == "confirm" and run["status"] in RERUN_STATUSES, "notice": notice}


def cancel_view(run: dict[str, Any], query: Any) -> dict[str, Any]:
    """What the run summary's Cancel part shows: ``cancel=confirm`` (where ``actions.cancel_run`` redirects a first,
    unconfirmed post) opens the confirmation step (python/awp/server/ui/templates/_run_summary.html) while the run can
    still be canceled (live, no cancel requested yet)."""
    live = run["status"] in LIVE_RUN and not run.get("cancel_requested_at")
    return {"confirm": query.get("cancel") == "confirm" and live}


async def task_context(db: Any, run_id: str, task_key: str, ipage: int = 0, query: Any = None) -> dict[str, Any]:
    """What the task panel shows: the task, its attempts, for a mapped task page ``ipage`` of its instances, and
    the state of its signal buttons (:func:`signal_view`, from ``query``)."""
    task = await db.get_task(run_id, task_key)
    for attempt in task["attempt_history"]:  # jsonb: timestamps arrive as ISO strings
        for name in ("started_at", "finished_at", "deadline"):
            if isinstance(attempt.get(name), str):
                attempt[name] = dt.datetime.fromisoformat(attempt[name])
    return {
        "task": task,
        "instances": await read_instances(db, run_id, task, ipage),
        "workers": await _workers_by_id(db),
        "run_id": run_id,
        "now": utc_now(),
        "signal": signal_view(task, query or {}),
    }
