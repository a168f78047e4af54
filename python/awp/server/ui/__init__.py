"""The web dashboard of ``awp serve`` (``/ui/``): runs, a run's live DAG, attempts, workers, cancel.

Server-rendered HTML (Jinja2 templates in ``templates/``) with one small script and one stylesheet in
``static/``, all served by the gateway from the installed package: no build step, no request to any other
host. It reads only through the SQL functions the API uses (:class:`awp.server.db.Database`). Routes, the session
cookie and the CSRF token are in :mod:`awp.server.ui.views`; the DAG layout in :mod:`awp.server.ui.dag`.
"""

from awp.server.ui.views import setup_ui

__all__ = ["setup_ui"]
