"""The web dashboard of ``awp serve`` (``/ui/``): runs, a run's live DAG, attempts, workers, cancel.

Server-rendered HTML (Jinja2 templates in ``templates/``) with one small script and one stylesheet in
``static/``, all served by the gateway from the installed package: no build step, no request to any other
host. It reads only through the SQL functions the API uses (:class:`awp.server.db.Database`).

The modules: :mod:`~awp.server.ui.pages` (the pages and the parts their script fetches), :mod:`~awp.server.ui.actions`
(sign-in, sign-out, cancel, re-run, signals), :mod:`~awp.server.ui.session` (the session cookie and the CSRF token),
:mod:`~awp.server.ui.routing` (what every route goes through), :mod:`~awp.server.ui.render` (templates, formatting,
static files), :mod:`~awp.server.ui.runview` (what the run page and its task panel show), :mod:`~awp.server.ui.dag`
(the DAG layout) and :mod:`~awp.server.ui.recent` (a big live run's summary, shared for a moment). Each route module
lists its routes in ``ROUTES``; :func:`setup_ui` adds them.
"""

from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from awp.server.ui import actions, pages
from awp.server.ui.recent import RecentRuns
from awp.server.ui.render import RECENT, RENDERER, STATIC, TEMPLATES, load_static, template_environment

__all__ = ["setup_ui"]


def setup_ui(app: web.Application) -> None:
    """Add the dashboard's routes to the gateway's application."""
    app[TEMPLATES] = template_environment()
    app[STATIC] = load_static()
    app[RECENT] = RecentRuns()
    app[RENDERER] = ThreadPoolExecutor(1, thread_name_prefix="awp-ui-render")
    for method, path, handler in (*actions.ROUTES, *pages.ROUTES):
        app.router.add_route(method, path, handler, name=handler.__name__)

    async def stop_renderer(app: web.Application) -> None:
        app[RENDERER].shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(stop_renderer)
