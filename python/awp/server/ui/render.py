"""How the dashboard renders: its templates (Jinja2, ``templates/``) and the helpers they call, its static files
(``static/``, served from the installed package), the thread that renders big pages off the event loop, and the
state the dashboard keeps in the gateway's application (:data:`TEMPLATES`, :data:`STATIC`, :data:`RECENT`,
:data:`RENDERER`)."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import hashlib
import json
import mimetypes
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from aiohttp import web
from markupsafe import Markup

from awp.protocol.jsonio import dumps
from awp.protocol.statuses import LIVE_RUN, RUN_STATUSES, TASK_STATUSES
from awp.server.ui import dag
from awp.server.ui.recent import RecentRuns

PREVIEW_CHARS = 2000
INSTANCES_PAGE = 50  # instances of a mapped task listed per page of its task panel
GLYPH = {
    "waiting_dependencies": "…",
    "ready": "○",
    "queued": "◔",
    "running": "▶",
    "waiting_retry": "↻",
    "succeeded": "✓",
    "failed": "✗",
    "canceled": "⊘",
    "skipped": "\u2013",  # en dash
}
# Why a task was skipped (awp.run_tasks skip_reason), as shown after its status; python/awp/server/ui/static/app.js has
# the same words for a task skipped while the page is open.
SKIP_REASONS = {"condition_false": "condition false", "dependency_failed": "dependency failed"}
# The task panel's signal buttons (docs/waits.md: "the dashboard's Reject button sends {"approved": false}"): the
# name a form posts -> the payload awp.send_signal receives, and the words of the panel's notice afterwards.
SIGNALS: dict[str, dict[str, bool]] = {"approve": {"approved": True}, "reject": {"approved": False}}
# The statuses of a run awp.retry_run takes back to running (docs/protocol.md, "Re-run"): its summary's Re-run button.
RERUN_STATUSES = ("failed", "canceled")

TEMPLATES = web.AppKey("ui_templates", jinja2.Environment)
STATIC = web.AppKey("ui_static", dict)
RECENT = web.AppKey("ui_recent_runs", RecentRuns)
# The thread that lays out and renders run pages, off the event loop (claims, heartbeats and health keep being
# answered meanwhile). One: rendering is pure Python, so more threads would not render faster (the GIL), and
# each would take the GIL from the event loop as often; a page's size is bounded anyway (dag.PAGE_SIZE tasks,
# dag.MAX_EDGES edges).
RENDERER = web.AppKey("ui_renderer", ThreadPoolExecutor)


# -- formatting ----------------------------------------------------------------------------------------


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def as_utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)


def fmt_ts(value: dt.datetime | None, with_date: bool = True, ms: bool = False) -> Markup:
    if value is None:
        return Markup("<span class=muted>—</span>")
    v = as_utc(value)
    text = v.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S")
    if ms:
        text += f".{v.microsecond // 1000:03d}"
    iso = v.isoformat(timespec="milliseconds")
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(iso, text)


def fmt_seconds(seconds: float) -> str:
    if seconds < 0:
        seconds = 0
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} m"
    return f"{s // 86400} d {s % 86400 // 3600:02d} h"


def fmt_duration(start: dt.datetime | None, end: dt.datetime | None, now: dt.datetime) -> str:
    if start is None:
        return "—"
    return fmt_seconds(((end or now) - start).total_seconds())


def fmt_age(value: dt.datetime | None, now: dt.datetime) -> str:
    if value is None:
        return "never"
    return fmt_seconds((now - value).total_seconds()) + " ago"


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=False)
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more characters)"


def progress(counts: dict[str, int], width: int = 160) -> dict[str, Any]:
    """Segments of a stacked bar of tasks by status, and the totals."""
    total = sum(counts.values())
    segments = []
    x = 0.0
    for status in TASK_STATUSES:
        n = counts.get(status, 0)
        w = width * n / total if total else 0
        segments.append({"status": status, "n": n, "x": round(x, 2), "w": round(w, 2)})
        x += w
    done = sum(counts.get(s, 0) for s in ("succeeded", "failed", "canceled", "skipped"))
    return {"total": total, "done": done, "segments": segments, "width": width}


def task_url(run_id: str, key: str) -> str:
    return f"/ui/runs/{quote(run_id, safe='')}/tasks/{quote(key, safe='')}"


def run_task_url(run_id: str, key: str, ipage: int | None = None) -> str:
    """The run page with ``key``'s task panel open (on page ``ipage`` of its instances, 0-based, when given): a link
    that works without the script, which opens the panel in place instead."""
    query = {"task": key} if ipage is None else {"task": key, "ipage": ipage + 1}
    return f"/ui/runs/{quote(run_id, safe='')}?" + urlencode(query)


def run_url(run_id: str) -> str:
    return f"/ui/runs/{quote(run_id, safe='')}"


def status_text(status: str, skip_reason: str | None = None) -> str:
    """A task's status in words; a skipped one's says why: "skipped (condition false)"."""
    words = status.replace("_", " ")
    if status == "skipped" and skip_reason:
        return f"{words} ({SKIP_REASONS.get(skip_reason, skip_reason.replace('_', ' '))})"
    return words


def json_island(value: Any) -> Markup:
    """JSON for a <script type=application/json> block (no "</" can end it early)."""
    return Markup(dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


# -- rendering -----------------------------------------------------------------------------------------


def template_environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("awp.server.ui", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.globals.update(
        ts=fmt_ts,
        duration=fmt_duration,
        age=fmt_age,
        preview=preview,
        progress=progress,
        task_url=task_url,
        run_task_url=run_task_url,
        run_url=run_url,
        status_text=status_text,
        instances_page=INSTANCES_PAGE,
        quote=lambda s: quote(str(s), safe=""),
        glyph=GLYPH,
        task_statuses=TASK_STATUSES,
        run_statuses=RUN_STATUSES,
        json_island=json_island,
        live_run=LIVE_RUN,
        max_edges=dag.MAX_EDGES,
        signals={name: json.dumps(payload) for name, payload in SIGNALS.items()},
        rerun_statuses=RERUN_STATUSES,
    )
    return env


def load_static() -> dict[str, tuple[bytes, str, str]]:
    files: dict[str, tuple[bytes, str, str]] = {}
    for entry in resources.files("awp.server.ui").joinpath("static").iterdir():
        if entry.is_file():
            body = entry.read_bytes()
            ctype = mimetypes.guess_type(entry.name)[0] or "application/octet-stream"
            if entry.name.endswith(".js"):
                ctype = "text/javascript"
            files[entry.name] = (body, ctype, hashlib.sha256(body).hexdigest()[:12])
    return files


def render_html(app: web.Application, template: str, **context: Any) -> bytes:
    static = app[STATIC]

    def static_url(name: str) -> str:
        return f"/ui/static/{name}?v={static[name][2]}"

    return app[TEMPLATES].get_template(template).render(static_url=static_url, **context).encode()


def render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    html = render_html(request.app, template, **context)
    return web.Response(body=html, status=status, content_type="text/html", charset="utf-8")


async def off_loop(request: web.Request, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``work(*args, **kwargs)`` in the dashboard's render thread (:data:`RENDERER`)."""
    call = functools.partial(work, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(request.app[RENDERER], call)
