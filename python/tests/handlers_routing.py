"""Handlers for the routing tests (loaded with ``--handlers python/tests/handlers_routing.py``): one handler per
action named in ``AWP_TEST_ACTIONS`` (comma-separated), so each test worker runs only the actions it is given."""

from __future__ import annotations

import os
from typing import Any

from awp.handlers import Context, handler


def _make(action: str) -> Any:
    def run(input: Any, ctx: Context) -> dict[str, Any]:
        return {"action": action, "pid": os.getpid()}

    return run


for _action in filter(None, os.environ.get("AWP_TEST_ACTIONS", "").split(",")):
    handler(_action)(_make(_action))
