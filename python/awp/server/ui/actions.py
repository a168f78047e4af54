"""The dashboard's forms: sign-in and sign-out, and the operator's actions on a run (cancel, re-run) and on a
task waiting for a signal (approve, reject). Every form that changes something is refused without the session's
CSRF token or from another origin (:func:`awp.server.ui.session.check_csrf`), and an action is the operator's.

Signals (docs/waits.md): the panel of a task waiting for a signal shows an operator Approve and Reject (the payloads
:data:`SIGNALS`), each confirmed by a second step before anything is sent (:func:`signal_task`).

Re-run (docs/protocol.md, "Re-run"): the summary of a failed or canceled run shows an operator Re-run, confirmed by a
second step as a signal is, then ``awp.retry_run`` of the whole run (:func:`retry_run`).
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

import psycopg
from aiohttp import web

from awp.server.appstate import CONFIG, DB
from awp.server.auth import Role, role_of
from awp.server.errors import ApiError
from awp.server.ui.render import RERUN_STATUSES, SIGNALS, render, run_task_url, run_url
from awp.server.ui.routing import Route, redirect, ui_route
from awp.server.ui.runview import signal_name, task_context
from awp.server.ui.session import (
    COOKIE,
    SESSION_TTL_S,
    Session,
    check_csrf,
    cross_site,
    new_session,
    read_form,
    safe_next,
    set_session_cookie,
)

ROUTES: list[Route] = []  # added to the application by awp.server.ui.setup_ui


# -- sign-in -------------------------------------------------------------------------------------------


SIGN_IN_ERRORS = {
    "wrong": "Wrong token: sign in with the viewer or the operator token.",
    "empty": "Enter a token.",
}


@ui_route(ROUTES, "GET", "/ui", kind="open")
async def root(request: web.Request, session: Session | None) -> web.StreamResponse:
    return redirect("/ui/")


@ui_route(ROUTES, "GET", "/ui/", kind="public")
async def sign_in_form(request: web.Request, session: Session | None) -> web.StreamResponse:
    next_url = safe_next(request.query.get("next"))
    if session is not None:
        return redirect(next_url)
    message = SIGN_IN_ERRORS.get(request.query.get("error", ""))
    return render(request, "login.html", session=None, next_url=next_url, message=message, nav="")


@ui_route(ROUTES, "POST", "/ui/login", kind="open")
async def sign_in(request: web.Request, session: Session | None) -> web.StreamResponse:
    if cross_site(request):
        raise ApiError.of(403, "a sign-in from another site is refused")
    form = await read_form(request)
    token = str(form.get("token", "")).strip()
    next_url = safe_next(str(form.get("next", "")))
    config = request.app[CONFIG]
    role = role_of(config, token) if token else None
    if role not in (Role.VIEWER, Role.OPERATOR):
        # Back to the form with the message (post/redirect/get: a reload does not post the token again, and
        # the browser logs no failed load). Worker tokens (bootstrap or session) are wrong tokens here.
        return redirect("/ui/?" + urlencode({"error": "wrong" if token else "empty", "next": next_url}))
    assert role is not None
    response = redirect(next_url)
    set_session_cookie(request, response, new_session(config, role), SESSION_TTL_S)
    return response


@ui_route(ROUTES, "POST", "/ui/logout")
async def sign_out(request: web.Request, session: Session | None) -> web.StreamResponse:
    assert session is not None
    await check_csrf(request, session)
    await request.app[DB].revoke_ui_session(session.session_id, session.ends)  # every cookie of it, every replica
    response = redirect("/ui/")
    response.del_cookie(COOKIE, path="/ui")
    return response


# -- runs and tasks ------------------------------------------------------------------------------------


@ui_route(ROUTES, "POST", "/ui/runs/{run_id}/cancel")
async def cancel_run(request: web.Request, session: Session | None) -> web.StreamResponse:
    """Cancel from a live run's summary (python/awp/server/ui/templates/_run_summary.html). Two steps, as Re-run's
    (:func:`retry_run`): without ``confirmed=yes`` nothing changes, the answer is the run page with the
    confirmation step (``?cancel=confirm``; the page's script shows that step in place); with it,
    ``awp.request_cancel``, then the run page."""
    assert session is not None
    form = await check_csrf(request, session)
    if not session.operator:
        raise ApiError.of(403, "only the operator may cancel a run; you signed in with the viewer token")
    run_id = request.match_info["run_id"]
    if form.get("confirmed") != "yes":
        return redirect(run_url(run_id) + "?" + urlencode({"cancel": "confirm"}))
    await request.app[DB].request_cancel(run_id)
    return redirect(f"/ui/runs/{quote(run_id, safe='')}")


@ui_route(ROUTES, "POST", "/ui/runs/{run_id}/retry")
async def retry_run(request: web.Request, session: Session | None) -> web.StreamResponse:
    """Re-run from a failed or canceled run's summary (python/awp/server/ui/templates/_run_summary.html), refused as a
    cancel is (:func:`cancel_run`: CSRF token, same origin, operator only). Two steps, as a signal's
    (:func:`signal_task`): without ``confirmed=yes`` nothing changes, the answer is the run page with the
    confirmation step (``?rerun=confirm``; the page's script shows that step in place); with it,
    ``awp.retry_run`` of the whole run, then the run page (the run is running again). AWREQ because the run is no
    longer failed or canceled (re-run already, e.g. a second click or another operator first): the run page with
    a notice saying so (``?rerun=refused``); an AWREQ for another reason (a for_each task among those to re-run)
    is the error page with the database's message."""
    assert session is not None
    form = await check_csrf(request, session)
    if not session.operator:
        raise ApiError.of(403, "only the operator may re-run a run; you signed in with the viewer token")
    run_id = request.match_info["run_id"]
    if form.get("confirmed") != "yes":
        return redirect(run_url(run_id) + "?" + urlencode({"rerun": "confirm"}))
    db = request.app[DB]
    try:
        await db.retry_run(run_id, None)
    except psycopg.Error as e:
        if e.sqlstate != "AWREQ":  # invalid_request (python/awp/server/errors.py); anything else is answered as usual
            raise
        if (await db.get_run(run_id))["status"] in RERUN_STATUSES:
            raise  # refused for what the run holds, not for its status: the error page gives the reason
        return redirect(run_url(run_id) + "?" + urlencode({"rerun": "refused"}))
    return redirect(run_url(run_id))


@ui_route(ROUTES, "POST", "/ui/runs/{run_id}/tasks/{task_key}/signal")
async def signal_task(request: web.Request, session: Session | None) -> web.StreamResponse:
    """Approve or Reject from a task panel (python/awp/server/ui/templates/_task.html): the form posts ``signal`` =
    ``approve`` or ``reject``, refused as a cancel is (:func:`cancel_run`: CSRF token, same origin, operator only).
    Two steps: without ``confirmed=yes`` nothing is sent, the answer is the panel's confirmation step
    (``?confirm=…``); with it, ``awp.send_signal`` with the payload of :data:`SIGNALS` (no idempotency key), then
    the run page with the panel open and the outcome (``?sent=…``, or ``?refused=…`` when the task no longer waits:
    AWSIG, e.g. a second click or another operator first). The page's script posts the second step with
    ``fragment=1`` and gets the refreshed panel itself (200 either way: the notice in it says what happened)."""
    assert session is not None
    form = await check_csrf(request, session)
    if not session.operator:
        raise ApiError.of(403, "only the operator may approve or reject a task; you signed in with the viewer token")
    run_id, task_key = request.match_info["run_id"], request.match_info["task_key"]
    name = signal_name(form.get("signal"))
    if name is None:
        raise ApiError.of(400, "signal must be approve or reject")
    if form.get("confirmed") != "yes":
        return redirect(run_task_url(run_id, task_key) + "&" + urlencode({"confirm": name}))
    db = request.app[DB]
    outcome = "sent"
    try:
        await db.send_signal(run_id, task_key, SIGNALS[name], None)
    except psycopg.Error as e:
        if (
            e.sqlstate != "AWSIG"
        ):  # signal_not_waiting (python/awp/server/errors.py); anything else is answered as usual
            raise
        outcome = "refused"
    if form.get("fragment") == "1":
        context = await task_context(db, run_id, task_key, 0, {outcome: name})
        return render(request, "_task.html", session=session, **context)
    return redirect(run_task_url(run_id, task_key) + "&" + urlencode({outcome: name}))
